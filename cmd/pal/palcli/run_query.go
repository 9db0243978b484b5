package palcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/runs"
)

// Where pal run get read a run from (the "source" field of --json).
const (
	sourceJournal  = "journal"
	sourcePostgres = "postgres"
)

// runGetOut is pal run get --json: the run as runs.RunView renders it
// (GET /v1/runs/{id} answers the same), and where it was read.
type runGetOut struct {
	*runs.RunView
	Source string `json:"source"`
}

func (e *env) runGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get RUN_ID [--json]",
		Short: "Show a run: status, usage and steps",
		Long: `pal run get shows a run: its status, workflow, timings, token usage, output
or error, and one line per step (its latest attempt).

Where it reads from: with DATABASE_URL set, the Postgres projection (the
same tables the API lists from); a run the projection does not hold yet, or
a Postgres that cannot be reached, is read from its journal instead. Without
DATABASE_URL, or with --journal, the run is folded from its journal on NATS
(PAL_EVENTS), which is always current. The output says which.

Each step shows its start offset from the run's creation, its duration
(waits and retries included), its wait, tokens and cost. An approval that
waits shows its prompt, who may decide and the command that decides it.
--waterfall draws the steps against one time axis scaled to the terminal
(--width to choose): # done, x failed, = running, ~ waiting. When steps
ran at once, a lane view follows: one row per lane, each holding steps
one after another, as many lanes as steps were in flight at most.

--json prints one JSON object, the same as GET /v1/runs/{id}, plus
"source": "journal" or "postgres".

Exit codes: 0 found, 2 bad run id, 3 unknown run, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.runGet)),
	}
	addJSONFlag(cmd, "print the run as one JSON object")
	addDatabaseFlag(cmd)
	cmd.Flags().Bool("journal", false, "read the journal on NATS even when DATABASE_URL is set")
	cmd.Flags().Bool("waterfall", false, "draw the steps against a time axis instead of the step table")
	cmd.Flags().Int("width", 0, "columns the waterfall may use (default: the terminal's width, else $COLUMNS, else 100)")
	return cmd
}

func (e *env) runGet(cmd *cobra.Command, args []string, s *settings) error {
	ctx := cmd.Context()
	runID := args[0]
	if err := event.ValidateRunID(runID); err != nil {
		return withCode(ExitBadInput, err)
	}
	var (
		view   *runs.RunView
		source string
	)
	forceJournal, _ := cmd.Flags().GetBool("journal")
	if dbURL := e.stringSetting(cmd, "database-url", "DATABASE_URL", ""); dbURL != "" && !forceJournal {
		v, err := e.getFromPostgres(ctx, dbURL, runID)
		switch {
		case err == nil:
			view, source = v, sourcePostgres
		case codeOf(err) == ExitBadInput:
			return err
		case errors.Is(err, projections.ErrRunNotFound):
			// The projection may lag behind the journal: look there.
		default:
			fmt.Fprintf(e.stderr, "pal: warning: %v; reading the journal instead\n", err)
		}
	}
	if view == nil {
		client, closeNC, err := e.connectClient(ctx, s)
		if err != nil {
			return err
		}
		defer closeNC()
		if view, err = client.Get(ctx, runID); err != nil {
			if errors.Is(err, eventstore.ErrRunNotFound) {
				if e.stringSetting(cmd, "database-url", "DATABASE_URL", "") == "" || forceJournal {
					// Retention (PAL_RETENTION) keeps a finished run's rows only.
					return withCode(ExitNotFound, fmt.Errorf("run %s not found in the journal (if retention removed it, its rows are in Postgres: set DATABASE_URL)", runID))
				}
				return withCode(ExitNotFound, fmt.Errorf("run %s not found", runID))
			}
			return err
		}
		source = sourceJournal
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, runGetOut{RunView: view, Source: source})
	}
	if wf, _ := cmd.Flags().GetBool("waterfall"); wf {
		width, _ := cmd.Flags().GetInt("width")
		if width <= 0 {
			width = e.termWidth()
		}
		now := time.Now()
		fmt.Fprintf(e.stdout, "Run %s  %s\n\n", view.RunID, view.Status)
		if err := printWaterfall(e.stdout, view, width, now); err != nil {
			return err
		}
		return printWaiting(e.stdout, view, now)
	}
	return printRun(e.stdout, view, source, time.Now())
}

func (e *env) getFromPostgres(ctx context.Context, dbURL, runID string) (*runs.RunView, error) {
	pool, err := e.connectPGNow(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	d, err := projections.NewReader(pool).GetRun(ctx, runID)
	if err != nil {
		return nil, pgHint(err)
	}
	return runs.ViewOfDetail(d), nil
}

// pgHint adds what to do to a query that failed for want of PAL's tables.
func pgHint(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return withCode(ExitUnavailable, fmt.Errorf("%w (the database has no PAL tables: run 'pal migrate' and 'pal projector')", err))
	}
	if errors.Is(err, projections.ErrRunNotFound) || errors.Is(err, projections.ErrBadCursor) {
		return err
	}
	return withCode(ExitUnavailable, err)
}

// resultText is what a step's result column shows: an LLM step's reply
// text, else the output's JSON.
func resultText(out json.RawMessage) string {
	var v struct {
		Text *string `json:"text"`
	}
	if json.Unmarshal(out, &v) == nil && v.Text != nil {
		return *v.Text
	}
	return string(out)
}

func parseTime(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// printRun prints a run for people.
func printRun(w io.Writer, v *runs.RunView, source string, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	created, ended := parseTime(v.CreatedAt), parseTime(v.EndedAt)
	fmt.Fprintf(tw, "Run\t%s\n", v.RunID)
	if v.Status == engine.StatusQueued {
		fmt.Fprintf(tw, "Status\t%s on queue %s (waiting for a worker of that queue: pal worker --queues %s)\n", v.Status, v.Queue, v.Queue)
	} else {
		fmt.Fprintf(tw, "Status\t%s\n", v.Status)
	}
	fmt.Fprintf(tw, "Queue\t%s\n", v.Queue)
	if v.Workflow != "" {
		fmt.Fprintf(tw, "Workflow\t%s\n", v.Workflow)
	}
	if v.ParentRunID != "" {
		fmt.Fprintf(tw, "Parent\t%s (step %s, depth %d)\n", v.ParentRunID, v.ParentStepID, v.Depth)
	}
	fmt.Fprintf(tw, "Created\t%s\n", fmtTime(created, now))
	if !ended.IsZero() {
		fmt.Fprintf(tw, "Ended\t%s, took %s\n", fmtTime(ended, now), fmtDuration(ended.Sub(created)))
	} else {
		fmt.Fprintf(tw, "Running for\t%s\n", fmtDuration(now.Sub(created)))
	}
	if v.JournalRemovedAt != "" {
		fmt.Fprintf(tw, "Journal\tremoved by retention (PAL_RETENTION) %s; shown from Postgres\n", fmtTime(parseTime(v.JournalRemovedAt), now))
	}
	fmt.Fprintf(tw, "Drives\t%d\n", v.Resumes)
	u := v.Usage
	fmt.Fprintf(tw, "Usage\t%s, %s\n", usageLine(u), fmtUSD(u.CostUSD, 6))
	if b := v.Budget; b != nil {
		fmt.Fprintf(tw, "Budget\t%s\n", budgetLine(b, v.Spent, v.PausedOn))
	}
	if len(v.Input) > 0 {
		fmt.Fprintf(tw, "Input\t%s\n", truncate(string(v.Input), 100))
	}
	if len(v.Output) > 0 {
		fmt.Fprintf(tw, "Output\t%s\n", truncate(string(v.Output), 100))
	}
	if v.Error != "" {
		msg := v.Error
		if v.ErrorCode != "" {
			msg = v.ErrorCode + ": " + msg
		}
		if v.FailedStep != "" {
			msg += " (step " + v.FailedStep + ")"
		}
		fmt.Fprintf(tw, "Error\t%s\n", msg)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(v.Steps) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "STEP\tTYPE\tSTATUS\tATTEMPT\tSTART\tDURATION\tWAIT\tTOKENS\tCOST\tRESULT")
		for _, s := range v.Steps {
			var tokens int64
			cost := "-"
			if s.Usage != nil {
				tokens = s.Usage.TotalTokens
				if s.Usage.CostUSD > 0 {
					cost = fmtUSD(s.Usage.CostUSD, 6)
				}
			}
			result := truncate(resultText(s.Output), 60)
			if s.Error != "" {
				result = truncate(s.Error, 60)
			}
			if s.Model != "" {
				// Which model answered (or is being asked): a fallback
				// list may have called several.
				result = s.Model + ": " + result
			}
			if s.Delivery != "" {
				result = "delivery " + s.Delivery + " " + result
			}
			start := "-"
			if st := parseTime(s.StartedAt); !st.IsZero() && !created.IsZero() {
				start = "+" + fmtDuration(st.Sub(created))
			}
			dur, wait := "-", "-"
			if s.EndedAt != "" {
				dur = fmtDuration(time.Duration(s.DurationMs) * time.Millisecond)
				if s.WaitingSince != "" {
					wait = fmtDuration(time.Duration(s.WaitMs) * time.Millisecond)
				}
			} else if ws := parseTime(s.WaitingSince); !ws.IsZero() {
				wait = fmtDuration(now.Sub(ws)) + "…"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.StepID, dash(s.NodeType), s.Status, s.Attempt,
				start, dur, wait, fmtTokens(tokens), cost, dash(result))
			// Each model a fallback list called, with what it spent.
			for _, m := range s.Models {
				fmt.Fprintf(tw, "  └ %s\tmodel\t-\t%d\t-\t-\t-\t%s\t%s\t%s\n", m.Model, m.Attempts,
					fmtTokens(m.Usage.TotalTokens), fmtUSD(m.Usage.CostUSD, 6), usageLine(m.Usage))
			}
			// A process step's own sub-steps, as its child reported them.
			for _, sub := range s.Substeps {
				fmt.Fprintf(tw, "  └ %s\tsubstep\t%s\t-\t-\t-\t-\t-\t-\t%s\n", sub.Name, sub.Status,
					dash(truncate(resultText(sub.Output), 60)))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if err := printWaiting(w, v, now); err != nil {
			return err
		}
	}
	from := "its journal on NATS (PAL_EVENTS)"
	if source == sourcePostgres {
		from = "the Postgres projection"
	}
	_, err := fmt.Fprintf(w, "\n(read from %s up to seq %d)\n", from, v.LastSeq)
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (e *env) runListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "list [--status S] [--workflow NAME] [--queue Q] [--schedule NAME] [--label KEY=VALUE]... [--thread ID] [--since T] [--until T] [--error-code C] " +
			"[--search TEXT] [--limit N] [--before CURSOR] [--json]",
		Short: "List runs, newest first (needs DATABASE_URL)",
		Long: `pal run list lists runs, newest first, from the Postgres projection: set
DATABASE_URL (or --database-url) to the database pal projector writes to.

The filters are those of GET /v1/runs, and every one given must match:
--status keeps runs with one status: queued, running, waiting, succeeded,
failed or cancelled; --workflow keeps runs of the workflow of that name;
--schedule runs that schedule started (pal schedule create);
--label KEY=VALUE (repeatable) runs that carry the label (pal run start
--label); --thread ID runs started on that thread (pal run start
--thread); --since and --until (RFC 3339) runs created in that range (since
included, until not); --error-code runs that ended with that code
(step_failed, budget_exceeded, ...); --search runs whose error message
contains the text, ignoring case. --limit caps the page (default 50, at most
1000); when the page is full, the cursor of the next one is printed on
stderr (human output) or as "next" (--json); pass it to --before.

--json prints {"runs": [...], "next": "..."}, the same as GET /v1/runs.

Exit codes: 0 listed (even none), 2 bad flags or DATABASE_URL unset,
4 Postgres unreachable.`,
		Args: cobra.NoArgs,
		RunE: e.jsonErrors(e.runList),
	}
	addJSONFlag(cmd, `print {"runs": [...], "next": "..."} as one JSON object`)
	addDatabaseFlag(cmd)
	cmd.Flags().String("status", "", "only runs with this status (queued, running, waiting, succeeded, failed, cancelled)")
	cmd.Flags().String("workflow", "", "only runs of the workflow of this name")
	cmd.Flags().String("queue", "", "only runs on this work queue")
	cmd.Flags().String("schedule", "", "only runs this schedule started")
	cmd.Flags().StringArray("label", nil, "only runs with this label, KEY=VALUE (repeatable: all must match)")
	cmd.Flags().String("thread", "", "only runs started on this thread")
	cmd.Flags().String("since", "", "only runs created at or after this RFC 3339 time")
	cmd.Flags().String("until", "", "only runs created before this RFC 3339 time")
	cmd.Flags().String("error-code", "", "only runs that ended with this error code")
	cmd.Flags().String("search", "", fmt.Sprintf("only runs whose error message contains this text, ignoring case (at most %d bytes)", runs.MaxSearchBytes))
	cmd.Flags().Int("limit", projections.DefaultListLimit, fmt.Sprintf("most runs to list (1 to %d)", projections.MaxListLimit))
	cmd.Flags().String("before", "", "continue a listing: the cursor printed by the previous page")
	return cmd
}

// listFlags maps the query parameters of GET /v1/runs to pal run list's
// flags: the flags are read into a query and parsed by the same rule.
var listFlags = map[string]string{"status": "status", "workflow": "workflow", "queue": "queue", "schedule": "schedule", "label": "label", "thread": "thread", "since": "since",
	"until": "until", "error_code": "error-code", "q": "search", "limit": "limit", "before": "before"}

// listFilter reads pal run list's flags into the filter GET /v1/runs would
// make of the same query; an error names the flag.
func listFilter(cmd *cobra.Command) (projections.RunFilter, error) {
	q := url.Values{}
	for param, flag := range listFlags {
		f := cmd.Flags().Lookup(flag)
		if !f.Changed {
			continue
		}
		if param == "label" {
			q[param], _ = cmd.Flags().GetStringArray(flag)
			continue
		}
		q.Set(param, f.Value.String())
	}
	f, err := runs.ParseRunFilter(q)
	var ie *runs.InputError
	if errors.As(err, &ie) {
		return f, badInput("--%s: %s", listFlags[ie.Field], ie.Msg)
	}
	return f, err
}

func (e *env) runList(cmd *cobra.Command, _ []string) error {
	ctx := cmd.Context()
	f, err := listFilter(cmd)
	if err != nil {
		return err
	}
	dbURL := e.stringSetting(cmd, "database-url", "DATABASE_URL", "")
	if dbURL == "" {
		return badInput("pal run list reads the Postgres projection and DATABASE_URL is not set: set it (or --database-url) " +
			"to the database pal projector writes to; 'pal run get RUN_ID' reads a single run from NATS without it")
	}
	pool, err := e.connectPGNow(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := projections.NewReader(pool).ListRuns(ctx, f)
	if err != nil {
		return pgHint(err)
	}
	list := runs.ListOf(rows, f.Limit)
	if jsonFlag(cmd) {
		return printJSON(e.stdout, list)
	}
	if len(list.Runs) == 0 {
		fmt.Fprintln(e.stderr, "no runs")
		return nil
	}
	now := time.Now()
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN ID\tSTATUS\tWORKFLOW\tCREATED\tDURATION\tTOKENS\tCOST\tERROR")
	for _, r := range list.Runs {
		created := parseTime(r.CreatedAt)
		dur := now.Sub(created)
		if r.EndedAt != "" {
			dur = parseTime(r.EndedAt).Sub(created)
		}
		cost := "-"
		if r.Usage.CostUSD > 0 {
			cost = fmtUSD(r.Usage.CostUSD, 4)
		}
		errText := r.Error
		if r.ErrorCode != "" {
			errText = r.ErrorCode + ": " + errText
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.RunID, r.Status, dash(r.Workflow), fmtShortTime(created),
			fmtDuration(dur), fmtTokens(r.Usage.TotalTokens), cost, dash(truncate(errText, 50)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if list.Next != "" {
		fmt.Fprintf(e.stderr, "more: pal run list --before %s%s\n", list.Next, flagsAgain(cmd))
	}
	return nil
}

// plainWord is a value a shell takes as it is.
var plainWord = regexp.MustCompile(`^[A-Za-z0-9_.@/+-]+$`)

// flagsAgain repeats the filter flags of a listing, for the next page.
func flagsAgain(cmd *cobra.Command) string {
	var b strings.Builder
	for _, name := range []string{"status", "workflow", "queue", "schedule", "label", "thread", "since", "until", "error-code", "search", "limit"} {
		f := cmd.Flags().Lookup(name)
		if f == nil || !f.Changed {
			continue
		}
		vs := []string{f.Value.String()}
		if name == "label" {
			vs, _ = cmd.Flags().GetStringArray(name)
		}
		for _, v := range vs {
			if !plainWord.MatchString(v) {
				v = shellQuote(v)
			}
			fmt.Fprintf(&b, " --%s %s", name, v)
		}
	}
	return b.String()
}

func (e *env) runWatchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "watch RUN_ID [--json]",
		Short: "Follow a run until it ends, LLM steps' text as it is written; the exit code says how it ended",
		Long: `pal run watch prints a run's progress (steps starting, completing, failing,
retrying, waiting; the run's drives and its end) from its journal on NATS,
then keeps following it until the run ends. A run that has already ended is
shown and the command returns at once.

The text of an LLM step is printed under the step as the model writes it
(pal.deltas.<run_id>; thinking, where the provider streams it, with a
dotted gutter). When a call starts again (a retry, or another worker
resuming the step after a crash), a line says so and the text starts
again. A watch that begins in the middle of a step first prints its text
so far.

--json prints every event of the journal as one JSON line (the envelope, as
in PAL_EVENTS), and no streamed text.

Exit codes: 0 the run succeeded, 1 it failed or was cancelled, 2 bad run
id, 3 unknown run, 4 NATS unreachable, 130 Ctrl-C stopped the watch (the
run goes on).`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.runWatch)),
	}
	addJSONFlag(cmd, "print every event as one JSON line")
	return cmd
}

func (e *env) runWatch(cmd *cobra.Command, args []string, s *settings) error {
	ctx := cmd.Context()
	runID := args[0]
	if err := event.ValidateRunID(runID); err != nil {
		return withCode(ExitBadInput, err)
	}
	asJSON := jsonFlag(cmd)
	client, closeNC, err := e.connectClient(ctx, s)
	if err != nil {
		return err
	}
	defer closeNC()
	store := client.Store()
	evs, head, err := store.Read(ctx, runID)
	if errors.Is(err, eventstore.ErrRunNotFound) {
		return withCode(ExitNotFound, fmt.Errorf("run %s not found", runID))
	}
	if errors.Is(err, event.ErrJournalCorrupt) {
		// It has ended: failed, journal_corrupt, sealed or not yet.
		return withCode(ExitRunFailed, fmt.Errorf("run %s failed: %w", runID, err))
	}
	if err != nil {
		return withCode(ExitUnavailable, err)
	}
	var created time.Time
	text := newTextPrinter(e.stdout)
	show := func(ev event.Event) {
		if asJSON {
			_ = printJSON(e.stdout, ev)
			return
		}
		text.event(ev)
		switch ev.Kind {
		case event.RunCreated:
			created = ev.TS
			fmt.Fprintf(e.stdout, "watching run %s (%s)\n", runID, summary(ev))
		case event.RunSucceeded, event.RunFailed, event.RunCancelled:
			fmt.Fprintln(e.stdout, humanLine(ev))
		default:
			if notable(ev.Kind) {
				fmt.Fprintln(e.stdout, humanLine(ev))
			}
		}
	}
	var final *event.Event
	for i := range evs {
		show(evs[i])
		if evs[i].Kind.Terminal() {
			final = &evs[i]
		}
	}
	if final == nil {
		onEvent := func(ev event.Event) error {
			show(ev)
			if ev.Kind.Terminal() {
				final = &ev
				return eventstore.ErrStopWatch
			}
			return nil
		}
		if asJSON {
			err = store.Watch(ctx, runID, head, onEvent)
		} else {
			err = store.WatchWithDeltas(ctx, runID, head, onEvent, func(d event.Delta) error {
				text.delta(d)
				return nil
			})
		}
		if err != nil {
			return followError(ctx, runID, err)
		}
	}
	took := ""
	if !created.IsZero() {
		took = " after " + fmtDuration(final.TS.Sub(created))
	}
	switch final.Kind {
	case event.RunSucceeded:
		if !asJSON {
			fmt.Fprintf(e.stdout, "run %s succeeded%s\n", runID, took)
		}
		return nil
	case event.RunFailed:
		var d event.RunFailedData
		_ = final.DecodeData(&d)
		return withCode(ExitRunFailed, fmt.Errorf("run %s failed%s: %s", runID, took, d.Error))
	default:
		var d event.RunCancelledData
		_ = final.DecodeData(&d)
		msg := fmt.Sprintf("run %s was cancelled%s", runID, took)
		if d.By != "" {
			msg += " by " + d.By
		}
		if d.Reason != "" {
			msg += ": " + d.Reason
		}
		return withCode(ExitRunFailed, errors.New(msg))
	}
}

// notable reports the kinds pal run watch shows.
func notable(k event.Kind) bool {
	switch k {
	case event.RunResumed, event.StepStarted, event.StepCompleted, event.StepFailed, event.StepRetrying,
		event.StepWaiting, event.ApprovalReceived, event.SignalReceived, event.ChildRunCreated, event.AnomalyDetected,
		event.SubstepCompleted:
		return true
	}
	return false
}

// budgetLine renders a run's limits with what it spent of each: "$0.0021
// of $0.0030, 5 of 10 steps (on exceed: pause; paused)".
func budgetLine(b *event.Budget, sp engine.Spend, paused string) string {
	var parts []string
	if b.MaxCostUSD > 0 {
		parts = append(parts, fmtUSD(sp.CostUSD, 4)+" of "+fmtUSD(b.MaxCostUSD, 4))
	}
	if b.MaxTokens > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d tokens", sp.Tokens, b.MaxTokens))
	}
	if b.MaxSteps > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d steps", sp.Steps, b.MaxSteps))
	}
	if b.MaxDurationMs > 0 {
		parts = append(parts, fmt.Sprintf("at most %s", fmtDuration(time.Duration(b.MaxDurationMs)*time.Millisecond)))
	}
	onExceed := b.OnExceed
	if onExceed == "" {
		onExceed = event.OnExceedFail
	}
	tail := "on exceed: " + onExceed
	if paused != "" {
		tail += "; paused on " + paused
	}
	return strings.Join(parts, ", ") + " (" + tail + ")"
}

// usageLine is a usage's tokens: in and out, and the parts of them read
// from and written to a prompt cache and spent thinking, when there are.
func usageLine(u event.Usage) string {
	line := fmt.Sprintf("%d tokens (%d in, %d out", u.TotalTokens, u.InputTokens, u.OutputTokens)
	if u.CacheReadTokens > 0 || u.CacheWriteTokens > 0 {
		line += fmt.Sprintf("; cache %d read, %d written", u.CacheReadTokens, u.CacheWriteTokens)
	}
	if u.ReasoningTokens > 0 {
		line += fmt.Sprintf("; %d reasoning", u.ReasoningTokens)
	}
	return line + ")"
}
