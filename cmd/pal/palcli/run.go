package palcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workflow"
)

func (e *env) runCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Start and inspect runs",
	}
	cmd.AddCommand(e.runStartCmd(), e.runGetCmd(), e.runListCmd(), e.runWatchCmd(), e.runEventsCmd(),
		e.runApproveCmd(), e.runCancelCmd(), e.runBudgetCmd(), e.runIDCmd(), e.runExportCmd(), e.runVerifyCmd())
	// Signed receipts.
	cmd.AddCommand(e.runReceiptCmd())
	cmd.AddCommand(e.runOperateCmds()...) // signal, resume, fork, retry (run_operate.go)
	return cmd
}

func (e *env) runStartCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "start NAME[@VERSION] | --workflow FILE [--input JSON] [--wait]",
		Short: "Start a run of a workflow; prints the run id",
		Long: `pal run start starts a deployed workflow, NAME (its latest version) or
NAME@VERSION (pal workflow deploy), or with --workflow FILE the workflow in
FILE, which it validates and deploys first: either way the run is of a
deployed version, and keeps it. It creates the run (run_created in its
journal) and queues it for the workers. It prints the run id alone on
stdout, or with --json {"run_id":…,"created":…} (created is false when the
idempotency key named a run that existed already). With --wait it then
follows the run and exits 0 when it succeeds, 1 when it fails or is
cancelled; progress goes to stderr. Ctrl-C stops following, not the run:
exit code 130, and pal run watch follows it again.`,
		Args: cobra.MaximumNArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.runStart)),
	}
	addJSONFlag(cmd, `print {"run_id":…,"created":…} instead of the bare run id`)
	f := cmd.Flags()
	f.StringP("workflow", "w", "", "workflow JSON file ('-' for stdin), deployed before the start; instead of NAME")
	f.StringP("input", "i", "{}", "run input as JSON, or @FILE")
	f.Bool("wait", false, "wait for the run to end; exit non-zero unless it succeeded")
	f.String("run-id", "", "run id to use (letters, digits, '_' and '-'); generated when empty")
	f.String("idempotency-key", "", "start at most one run for this key")
	f.String("budget", "", `narrow the workflow's policy.budget for this run, e.g. '{"maxCostUsd":1}' (a wider limit is refused)`)
	f.StringArray("label", nil, fmt.Sprintf("label the run KEY=VALUE, for pal run list --label (repeatable, at most %d)", event.MaxLabels))
	f.String("thread", "", "continue this thread (created on first use): the run's thread steps start from its turns and add theirs")
	return cmd
}

func readArg(v string, stdin io.Reader) ([]byte, error) {
	switch {
	case v == "-":
		return readLimited(stdin, "stdin")
	case strings.HasPrefix(v, "@"):
		return readFileLimited(v[1:])
	default:
		return []byte(v), nil
	}
}

// readLimited reads what PAL would accept from r, at most the API's body
// limit, and refuses more without reading on (a file like /dev/zero ends
// here, not in the kernel's OOM killer).
func readLimited(r io.Reader, name string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, runs.MaxCommandBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > runs.MaxCommandBytes {
		return nil, fmt.Errorf("%s is larger than the limit of %d bytes", name, runs.MaxCommandBytes)
	}
	return b, nil
}

func readFileLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readLimited(f, path)
}

func (e *env) runStart(cmd *cobra.Command, args []string, s *settings) error {
	ctx := cmd.Context()
	wf, err := startWorkflow(cmd, args)
	if err != nil {
		return err
	}
	inArg, _ := cmd.Flags().GetString("input")
	input, err := readArg(inArg, cmd.InOrStdin())
	if err != nil {
		return badInput("reading input: %v", err)
	}
	if !json.Valid(input) {
		return badInput("--input is not valid JSON: %s", truncate(string(input), 80))
	}
	runID, _ := cmd.Flags().GetString("run-id")
	if runID != "" {
		if err := event.ValidateRunID(runID); err != nil {
			return withCode(ExitBadInput, err)
		}
	}
	key, _ := cmd.Flags().GetString("idempotency-key")
	thread, _ := cmd.Flags().GetString("thread")
	if thread != "" {
		if err := event.ValidateThreadID(thread); err != nil {
			return badInput("--thread: %v", err)
		}
	}
	var budget *workflow.Budget
	if b, _ := cmd.Flags().GetString("budget"); b != "" {
		budget = &workflow.Budget{}
		if err := runs.DecodeStrict([]byte(b), budget); err != nil {
			return badInput("--budget: %v (want e.g. '{\"maxCostUsd\":1,\"maxSteps\":20}')", err)
		}
	}
	labels, err := startLabels(cmd)
	if err != nil {
		return err
	}

	client, closeNC, err := e.connectClient(ctx, s)
	if err != nil {
		return err
	}
	defer closeNC()
	// The CLI acts as itself: its NATS credentials bound what it may do.
	res, err := client.Start(ctx, runs.StartCommand{RunID: runID, Workflow: wf, Input: input, IdempotencyKey: key,
		Budget: budget, Labels: labels, Thread: thread, By: "pal-cli", Rights: runs.AllRights})
	if err != nil {
		if res.RunID == "" {
			return err // its exit code by runs.Classify: a refused budget is bad input
		}
		fmt.Fprintf(e.stderr, "pal: warning: %v\n", err)
	}
	if jsonFlag(cmd) {
		if err := printJSON(e.stdout, startOutput{RunID: res.RunID, Created: res.Created}); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(e.stdout, res.RunID)
	}
	if wait, _ := cmd.Flags().GetBool("wait"); !wait {
		return nil
	}
	return e.follow(ctx, client.Store(), res.RunID, func(ev event.Event) { e.progress(ev) })
}

// startLabels reads the --label flags of pal run start; the start checks
// their count and sizes (event.CheckLabels).
func startLabels(cmd *cobra.Command) (runs.Labels, error) {
	flags, _ := cmd.Flags().GetStringArray("label")
	if len(flags) == 0 {
		return nil, nil
	}
	labels := runs.Labels{}
	for _, l := range flags {
		k, v, err := runs.ParseLabel(l)
		if err != nil {
			return nil, badInput("--%v", err)
		}
		if old, dup := labels[k]; dup && old != v {
			return nil, badInput("--label %s given twice (%q and %q): a run has one value per label", k, truncate(old, 40), truncate(v, 40))
		}
		labels[k] = v
	}
	return labels, nil
}

// startWorkflow is the start's workflow: a deployed one's name (a JSON
// string) from the argument, or the definition in --workflow's file.
func startWorkflow(cmd *cobra.Command, args []string) (json.RawMessage, error) {
	wfPath, _ := cmd.Flags().GetString("workflow")
	switch {
	case len(args) == 1 && wfPath != "":
		return nil, badInput("give a deployed workflow's NAME[@VERSION] or --workflow FILE, not both")
	case len(args) == 1:
		if _, err := runs.ParseWorkflowRef("workflow", args[0]); err != nil {
			return nil, withCode(ExitBadInput, err)
		}
		return json.Marshal(args[0])
	case wfPath == "":
		return nil, badInput("name the workflow: pal run start NAME[@VERSION] (pal workflow deploy FILE deploys one), or --workflow FILE")
	}
	var wf []byte
	var err error
	if wfPath == "-" {
		wf, err = readArg("-", cmd.InOrStdin())
	} else {
		wf, err = readFileLimited(wfPath)
	}
	if err != nil {
		return nil, badInput("reading workflow: %v", err)
	}
	return wf, nil
}

// startOutput is what pal run start --json prints, the REST API's answer.
type startOutput struct {
	RunID   string `json:"run_id"`
	Created bool   `json:"created"`
}

// follow watches a run until its terminal event and maps it to an exit
// code: nil for success, exit code 1 for failed or cancelled.
func (e *env) follow(ctx context.Context, store *eventstore.Store, runID string, each func(event.Event)) error {
	var final event.Event
	err := store.Watch(ctx, runID, eventstore.Head{}, func(ev event.Event) error {
		each(ev)
		if ev.Kind.Terminal() {
			final = ev
			return eventstore.ErrStopWatch
		}
		return nil
	})
	if err != nil {
		return followError(ctx, runID, err)
	}
	switch final.Kind {
	case event.RunSucceeded:
		return nil
	case event.RunFailed:
		var d event.RunFailedData
		_ = final.DecodeData(&d)
		return withCode(ExitRunFailed, fmt.Errorf("run %s failed: %s", runID, d.Error))
	default:
		var d event.RunCancelledData
		_ = final.DecodeData(&d)
		return withCode(ExitRunFailed, fmt.Errorf("run %s was cancelled %s", runID, d.Reason))
	}
}

// followError is the error of a follow of runID that ended before the
// run: stopped by a signal (ExitInterrupted, saying the run goes on and
// how to follow it again), else NATS (ExitUnavailable).
func followError(ctx context.Context, runID string, err error) error {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return withCode(ExitInterrupted, fmt.Errorf("stopped following run %s; the run goes on (pal run watch %s follows it again, pal run cancel %s stops it)", runID, runID, runID))
	}
	return withCode(ExitUnavailable, err)
}

// progress prints one line per notable event to stderr.
func (e *env) progress(ev event.Event) {
	switch ev.Kind {
	case event.StepStarted, event.StepCompleted, event.StepFailed, event.StepRetrying, event.StepWaiting,
		event.RunResumed, event.RunSucceeded, event.RunFailed, event.RunCancelled:
		fmt.Fprintf(e.stderr, "%s\n", humanLine(ev))
	}
}

func (e *env) runEventsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "events RUN_ID [--json] [--follow]",
		Short: "Print a run's journal",
		Long: `pal run events prints the run's journal from its JetStream subject, one
event per line. --json prints each envelope as one JSON line. --follow
keeps printing new events until the run ends; Ctrl-C stops it (exit code
130, the run goes on).`,
		Args: cobra.ExactArgs(1),
		RunE: e.withSettings(func(cmd *cobra.Command, args []string, s *settings) error {
			runID := args[0]
			if err := event.ValidateRunID(runID); err != nil {
				return withCode(ExitBadInput, err)
			}
			asJSON, _ := cmd.Flags().GetBool("json")
			followOn, _ := cmd.Flags().GetBool("follow")
			client, closeNC, err := e.connectClient(cmd.Context(), s)
			if err != nil {
				return err
			}
			defer closeNC()
			store := client.Store()
			print := func(ev event.Event) {
				if asJSON {
					b, _ := json.Marshal(ev)
					fmt.Fprintf(e.stdout, "%s\n", b)
				} else {
					fmt.Fprintln(e.stdout, humanLine(ev))
				}
			}
			evs, head, err := store.Read(cmd.Context(), runID)
			if errors.Is(err, event.ErrJournalCorrupt) {
				// The sound events, then why the rest is not shown.
				for _, ev := range evs {
					print(ev)
				}
				return withCode(ExitRunFailed, err)
			}
			if err != nil {
				if errors.Is(err, eventstore.ErrRunNotFound) {
					return withCode(ExitNotFound, fmt.Errorf("run %s not found", runID))
				}
				return err
			}
			for _, ev := range evs {
				print(ev)
			}
			if !followOn || evs[len(evs)-1].Kind.Terminal() {
				return nil
			}
			err = store.Watch(cmd.Context(), runID, head, func(ev event.Event) error {
				print(ev)
				if ev.Kind.Terminal() {
					return eventstore.ErrStopWatch
				}
				return nil
			})
			if err != nil {
				return followError(cmd.Context(), runID, err)
			}
			return nil
		}),
	}
	cmd.Flags().Bool("json", false, "print each event as one JSON line")
	cmd.Flags().BoolP("follow", "f", false, "keep printing new events until the run ends")
	return cmd
}

// humanLine renders an event for people.
func humanLine(ev event.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%4d  %s  %-22s", ev.Seq, ev.TS.Local().Format(time.TimeOnly+".000"), ev.Kind)
	if ev.StepID != "" {
		fmt.Fprintf(&b, "  %s", ev.StepID)
		if ev.Attempt > 1 {
			fmt.Fprintf(&b, " (attempt %d)", ev.Attempt)
		}
	}
	if s := summary(ev); s != "" {
		fmt.Fprintf(&b, "  %s", s)
	}
	return b.String()
}

func summary(ev event.Event) string {
	switch ev.Kind {
	case event.RunCreated:
		var d event.RunCreatedData
		_ = ev.DecodeData(&d)
		return fmt.Sprintf("workflow=%s", d.WorkflowName)
	case event.RunResumed:
		var d event.RunResumedData
		_ = ev.DecodeData(&d)
		s := fmt.Sprintf("worker=%s drive=%d", d.Worker, d.ResumeCount)
		if d.Crashed {
			s += " (previous drive interrupted)"
		}
		return s
	case event.StepCompleted:
		var d event.StepCompletedData
		_ = ev.DecodeData(&d)
		s := fmt.Sprintf("%dms", d.DurationMs)
		if d.Usage != nil && d.Usage.TotalTokens > 0 {
			s += fmt.Sprintf(" tokens=%d", d.Usage.TotalTokens)
		}
		if d.Delivery != "" {
			s += " delivery=" + d.Delivery
		}
		if d.CopiedFrom != nil {
			s += fmt.Sprintf(" copied from %s seq %d", d.CopiedFrom.RunID, d.CopiedFrom.Seq)
		}
		return s + " output=" + truncate(string(d.Output), 60)
	case event.StepFailed:
		var d event.StepFailedData
		_ = ev.DecodeData(&d)
		return d.Error
	case event.StepRetrying:
		var d event.StepRetryingData
		_ = ev.DecodeData(&d)
		return fmt.Sprintf("next attempt %d of %d in %dms: %s", d.Attempt, d.Of, d.DelayMs, d.Error)
	case event.StepWaiting:
		var d event.StepWaitingData
		_ = ev.DecodeData(&d)
		s := "waiting for " + d.Reason
		if d.ChildRunID != "" {
			s += " " + d.ChildRunID
		}
		if d.TimeoutAt != "" {
			s += " until " + d.TimeoutAt
		}
		return s
	case event.ApprovalReceived:
		var d event.ApprovalReceivedData
		_ = ev.DecodeData(&d)
		s := d.Decision + " by " + d.Approver
		if d.Comment != "" {
			s += ": " + truncate(d.Comment, 60)
		}
		return s
	case event.SubstepStarted:
		var d event.SubstepStartedData
		_ = ev.DecodeData(&d)
		return "substep=" + d.Name
	case event.SubstepCompleted:
		var d event.SubstepCompletedData
		_ = ev.DecodeData(&d)
		return "substep=" + d.Name + " output=" + truncate(string(d.Output), 60)
	case event.SignalReceived:
		var d event.SignalReceivedData
		_ = ev.DecodeData(&d)
		return fmt.Sprintf("signal %s by %s: %s", d.Signal, d.By, truncate(string(d.Payload), 60))
	case event.RunSucceeded:
		var d event.RunSucceededData
		_ = ev.DecodeData(&d)
		return "output=" + truncate(string(d.Output), 80)
	case event.RunFailed:
		var d event.RunFailedData
		_ = ev.DecodeData(&d)
		return d.Code + ": " + d.Error
	}
	return ""
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut at a rune boundary, never inside a character.
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
