package palcli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

func (e *env) runApproveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "approve RUN_ID --step STEP --approver NAME [--reject] [--comment TEXT]",
		Short: "Approve (or reject) a step that waits for a decision",
		Long: `pal run approve records a decision on an approval step of a run: approve by
default, reject with --reject. A decision the run cannot take (the run has
ended, the step is not an approval step that waits for one) is refused:
nothing is written and the command says why.

--json prints {"ok": true, "run_id": "..."} (or {"error", "detail"}).

Exit codes: 0 recorded, 2 bad input or refused (the run has ended, the step
is not waiting), 3 unknown run, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.runApprove)),
	}
	f := cmd.Flags()
	f.String("step", "", "the step id of the approval step")
	f.String("approver", "", "who decides (recorded in the journal)")
	f.Bool("reject", false, "reject instead of approve")
	f.String("comment", "", "a comment recorded with the decision")
	addJSONFlag(cmd, `print {"ok": true, "run_id": "..."} as JSON`)
	_ = cmd.MarkFlagRequired("step")
	_ = cmd.MarkFlagRequired("approver")
	return cmd
}

func (e *env) runApprove(cmd *cobra.Command, args []string, s *settings) error {
	ctx := cmd.Context()
	runID := args[0]
	step, _ := cmd.Flags().GetString("step")
	approver, _ := cmd.Flags().GetString("approver")
	reject, _ := cmd.Flags().GetBool("reject")
	comment, _ := cmd.Flags().GetString("comment")
	decision := "approve"
	if reject {
		decision = "reject"
	}
	if err := event.ValidateRunID(runID); err != nil {
		return withCode(ExitBadInput, err)
	}
	c := runs.ApproveCommand{RunID: runID, StepID: step, Decision: decision, Approver: approver, Comment: comment}
	if err := c.Validate(); err != nil {
		return withCode(ExitBadInput, err)
	}
	client, closeNC, err := e.connectClient(ctx, s)
	if err != nil {
		return err
	}
	defer closeNC()
	err = client.Approve(ctx, c)
	if err != nil {
		return err
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, api.OKAnswer{OK: true, RunID: runID})
	}
	verb := "approved"
	if reject {
		verb = "rejected"
	}
	fmt.Fprintf(e.stdout, "%s step %s of run %s (by %s)\n", verb, step, runID, approver)
	return nil
}

func (e *env) runCancelCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cancel RUN_ID [--reason TEXT] [--by NAME]",
		Short: "Cancel a run",
		Long: `pal run cancel appends run_cancelled to a queued, running or waiting run, once;
the worker driving it stops its in-flight LLM or HTTP call at once. A run
that has already ended is left as it is: nothing is written and the command
says how it ended.

--json prints {"ok": true, "run_id": "..."} (or {"error", "detail"}).

Exit codes: 0 cancelled, 2 bad run id or the run has already ended, 3 unknown
run, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.runCancel)),
	}
	cmd.Flags().String("reason", "", "why (recorded in run_cancelled)")
	cmd.Flags().String("by", "pal-cli", "who cancels (the worker_id of run_cancelled)")
	addJSONFlag(cmd, `print {"ok": true, "run_id": "..."} as JSON`)
	return cmd
}

func (e *env) runCancel(cmd *cobra.Command, args []string, s *settings) error {
	ctx := cmd.Context()
	runID := args[0]
	if err := event.ValidateRunID(runID); err != nil {
		return withCode(ExitBadInput, err)
	}
	reason, _ := cmd.Flags().GetString("reason")
	by, _ := cmd.Flags().GetString("by")
	if by == "" {
		return badInput("--by: say who cancels")
	}
	c := runs.CancelCommand{RunID: runID, Reason: reason, By: by}
	if err := c.Validate(); err != nil {
		return withCode(ExitBadInput, err)
	}
	client, closeNC, err := e.connectClient(ctx, s)
	if err != nil {
		return err
	}
	defer closeNC()
	if err := client.Cancel(ctx, c); err != nil {
		if errors.Is(err, runs.ErrRunFinished) {
			err = fmt.Errorf("%w; nothing was written", err)
		}
		return err
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, api.OKAnswer{OK: true, RunID: runID})
	}
	fmt.Fprintf(e.stdout, "cancelled run %s\n", runID)
	return nil
}

func (e *env) runBudgetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "budget RUN_ID [--add-usd N] [--add-tokens N] [--add-steps N] [--add-ms N] [--by NAME]",
		Short: "Raise a run's budget (a run paused on it goes on)",
		Long: `pal run budget appends budget_raised to a run: each --add-* grows a limit the
run has (its workflow's policy.budget, as narrowed when it started). A run
paused on its budget (onExceed "pause") is woken and goes on if the step it
stopped at now fits; otherwise it pauses again.

--json prints {"ok": true, "run_id": "..."} (or {"error", "detail"}).

Exit codes: 0 raised, 2 bad input (nothing to add, a limit the run does not
have) or the run has ended, 3 unknown run, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.runBudget)),
	}
	f := cmd.Flags()
	f.Float64("add-usd", 0, "add to maxCostUsd")
	f.Int64("add-tokens", 0, "add to maxTokens")
	f.Int64("add-steps", 0, "add to maxSteps")
	f.Int64("add-ms", 0, "add to maxDurationMs")
	f.String("by", "pal-cli", "who raises it (recorded in budget_raised)")
	addJSONFlag(cmd, `print {"ok": true, "run_id": "..."} as JSON`)
	return cmd
}

func (e *env) runBudget(cmd *cobra.Command, args []string, s *settings) error {
	ctx := cmd.Context()
	runID := args[0]
	if err := event.ValidateRunID(runID); err != nil {
		return withCode(ExitBadInput, err)
	}
	f := cmd.Flags()
	usd, _ := f.GetFloat64("add-usd")
	tokens, _ := f.GetInt64("add-tokens")
	steps, _ := f.GetInt64("add-steps")
	ms, _ := f.GetInt64("add-ms")
	by, _ := f.GetString("by")
	c := runs.BudgetCommand{RunID: runID, AddUSD: usd, AddTokens: tokens, AddSteps: steps, AddMs: ms, By: by}
	if err := c.Validate(); err != nil {
		return withCode(ExitBadInput, err)
	}
	client, closeNC, err := e.connectClient(ctx, s)
	if err != nil {
		return err
	}
	defer closeNC()
	if err := client.RaiseBudget(ctx, c); err != nil {
		return err
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, api.OKAnswer{OK: true, RunID: runID})
	}
	fmt.Fprintf(e.stdout, "raised the budget of run %s\n", runID)
	return nil
}
