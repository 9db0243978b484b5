package palcli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

// The operator's run commands: signal, resume, fork, retry.
func (e *env) runOperateCmds() []*cobra.Command {
	return []*cobra.Command{e.runSignalCmd(), e.runResumeCmd(), e.runForkCmd(), e.runRetryCmd()}
}

func (e *env) runSignalCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "signal RUN_ID NAME [--payload JSON|@FILE] [--by NAME]",
		Short: "Send a named signal to a run (a wait node takes it)",
		Long: `pal run signal appends signal_received to a run. A wait node of that name
takes the oldest signal it has not taken yet, so a signal sent before the
run gets there is kept; each is taken once. A run whose workflow has no
wait node for NAME, or that has ended, is refused and nothing is written.

Exit codes: 0 sent, 2 bad input or refused, 3 unknown run, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(2),
		RunE: e.jsonErrors(e.withSettings(e.runSignal)),
	}
	cmd.Flags().String("payload", "null", "the payload as JSON, or @FILE")
	cmd.Flags().String("by", "pal-cli", "who sends it (recorded in the journal)")
	addJSONFlag(cmd, `print {"ok": true, "run_id": "..."} as JSON`)
	return cmd
}

func (e *env) runSignal(cmd *cobra.Command, args []string, s *settings) error {
	runID, name := args[0], args[1]
	arg, _ := cmd.Flags().GetString("payload")
	payload, err := readArg(arg, cmd.InOrStdin())
	if err != nil {
		return badInput("reading payload: %v", err)
	}
	by, _ := cmd.Flags().GetString("by")
	c := runs.SignalCommand{RunID: runID, Signal: name, Payload: payload, By: by}
	if err := c.Validate(); err != nil {
		return withCode(ExitBadInput, err)
	}
	client, closeNC, err := e.connectClient(cmd.Context(), s)
	if err != nil {
		return err
	}
	defer closeNC()
	if err := client.Signal(cmd.Context(), c); err != nil {
		return err
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, api.OKAnswer{OK: true, RunID: runID})
	}
	fmt.Fprintf(e.stdout, "sent signal %s to run %s\n", name, runID)
	return nil
}

func (e *env) runResumeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "resume RUN_ID [--force]",
		Short: "Drive a run now, without waiting for its lease to lapse or the sweep",
		Long: `pal run resume puts a queued, running or waiting run at the head of the work
queue, so a worker drives it at once. A run whose lease a worker holds is
refused (code lease_held, naming the holder); --force breaks the lease and
takes the run over: the old holder's renewal fails, and the new drive's
fencing token keeps its later appends out of the journal (a frozen worker
that wakes up appends nothing). An ended run is refused: its journal stays
closed; pal run retry or pal run fork makes a new run.

Exit codes: 0 queued, 2 refused (lease held, run ended), 3 unknown run,
4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.runResume)),
	}
	cmd.Flags().Bool("force", false, "break the lease of the worker holding the run")
	addJSONFlag(cmd, `print {"ok": true, "run_id": "...", "broke"?: "worker"} as JSON`)
	return cmd
}

func (e *env) runResume(cmd *cobra.Command, args []string, s *settings) error {
	force, _ := cmd.Flags().GetBool("force")
	c := runs.ResumeCommand{RunID: args[0], Force: force}
	if err := c.Validate(); err != nil {
		return withCode(ExitBadInput, err)
	}
	client, closeNC, err := e.connectClient(cmd.Context(), s)
	if err != nil {
		return err
	}
	defer closeNC()
	res, err := client.Resume(cmd.Context(), c)
	if err != nil {
		return err
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, api.ResumeAnswer{OK: true, RunID: c.RunID, Broke: res.Broke, TakenBy: res.TakenBy})
	}
	what := "queued run " + c.RunID
	if res.Broke != "" {
		what = fmt.Sprintf("took run %s from %s", c.RunID, res.Broke)
	}
	if res.TakenBy != "" {
		fmt.Fprintf(e.stdout, "%s; %s drives it\n", what, res.TakenBy)
		return nil
	}
	fmt.Fprintf(e.stdout, "%s; no worker has taken it yet (is one running?)\n", what)
	return nil
}

func (e *env) runForkCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fork RUN_ID --from STEP [--workflow FILE] [--input JSON|@FILE]",
		Short: "Start a new run from a step of another; earlier steps are copied",
		Long: `pal run fork starts a new run whose run_created records forked_from. Every
step the source completed before STEP started is copied with its output
(step_completed marked copied_from) and never executed; STEP and what
follows run fresh under the new run's keys. With --workflow a step is
copied only if its node is unchanged (node hash), and every step completed
after one that runs again runs again too. It prints the new run id and
which steps are copied and which run again, and why.

Exit codes: 0 started, 2 bad input, 3 unknown run, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.runFork)),
	}
	f := cmd.Flags()
	f.String("from", "", "the step id to fork from")
	f.StringP("workflow", "w", "", "a workflow JSON file to use instead of the source's")
	f.StringP("input", "i", "", "run input as JSON, or @FILE (default: the source's)")
	f.String("run-id", "", "the new run's id (generated when empty)")
	addJSONFlag(cmd, `print {"run_id","forked_from","copied","rerun"} as JSON`)
	_ = cmd.MarkFlagRequired("from")
	return cmd
}

func (e *env) runFork(cmd *cobra.Command, args []string, s *settings) error {
	from, _ := cmd.Flags().GetString("from")
	newID, _ := cmd.Flags().GetString("run-id")
	c := runs.ForkCommand{RunID: args[0], From: from, NewRunID: newID, By: "pal-cli", Rights: runs.AllRights}
	if p, _ := cmd.Flags().GetString("workflow"); p != "" {
		wf, err := readFileLimited(p)
		if err != nil {
			return badInput("reading workflow: %v", err)
		}
		c.Workflow = wf
	}
	if arg, _ := cmd.Flags().GetString("input"); arg != "" {
		in, err := readArg(arg, cmd.InOrStdin())
		if err != nil {
			return badInput("reading input: %v", err)
		}
		c.Input = in
	}
	if err := c.Validate(); err != nil {
		return withCode(ExitBadInput, err)
	}
	client, closeNC, err := e.connectClient(cmd.Context(), s)
	if err != nil {
		return err
	}
	defer closeNC()
	res, err := client.Fork(cmd.Context(), c)
	return e.printFork(cmd, res, err)
}

func (e *env) runRetryCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "retry RUN_ID",
		Short: "Start a new run from a failed run's first failed step",
		Long: `pal run retry is pal run fork from the first failed step of a failed or
cancelled run (the step its run_failed names), with the same workflow and
input: the steps completed before it are copied, it and what follows run
again under the new run's keys.

Exit codes: 0 started, 2 refused (the run succeeded or has not ended),
3 unknown run, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.runRetry)),
	}
	cmd.Flags().String("run-id", "", "the new run's id (generated when empty)")
	addJSONFlag(cmd, `print {"run_id","forked_from","copied","rerun"} as JSON`)
	return cmd
}

func (e *env) runRetry(cmd *cobra.Command, args []string, s *settings) error {
	if err := event.ValidateRunID(args[0]); err != nil {
		return withCode(ExitBadInput, err)
	}
	newID, _ := cmd.Flags().GetString("run-id")
	client, closeNC, err := e.connectClient(cmd.Context(), s)
	if err != nil {
		return err
	}
	defer closeNC()
	res, err := client.Retry(cmd.Context(), runs.RetryCommand{RunID: args[0], NewRunID: newID, By: "pal-cli", Rights: runs.AllRights})
	return e.printFork(cmd, res, err)
}

// printFork prints what a fork or retry made: the new run id on stdout
// alone, and on stderr what was copied and what runs again, and why.
func (e *env) printFork(cmd *cobra.Command, res runs.ForkResult, err error) error {
	if err != nil && res.RunID == "" {
		return err
	}
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v\n", err)
	}
	if jsonFlag(cmd) {
		b, _ := json.Marshal(res)
		fmt.Fprintln(e.stdout, string(b))
		return nil
	}
	fmt.Fprintln(e.stdout, res.RunID)
	w := cmd.ErrOrStderr()
	fmt.Fprintf(w, "forked from run %s at step %s (seq %d)\n", res.ForkedFrom.RunID, res.ForkedFrom.StepID, res.ForkedFrom.Seq)
	for _, id := range res.Copied {
		fmt.Fprintf(w, "  copied  %s\n", id)
	}
	for _, r := range res.Rerun {
		fmt.Fprintf(w, "  re-run  %s: %s\n", r.StepID, r.Reason)
	}
	fmt.Fprintf(w, "  fresh   %s and every step after it\n", res.ForkedFrom.StepID)
	return nil
}
