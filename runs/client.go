package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// Client is the front door to PAL's runs: every transport (REST, the NATS
// service, the durable command processor, the CLI) decodes into one of
// the command structs and calls the same method. It writes only inputs
// to a run's journal (run_created, approval_received, signal_received,
// budget_raised, run_cancelled), each with a fenced append, and leaves
// driving to the workers.
type Client struct {
	store     *eventstore.Store
	nc        *nats.Conn
	reply     []string
	anomalies map[string]event.AnomalyRule
	prices    event.Prices
	// users are the client users PAL knows (WithUsers).
	users natsauth.Users
	// limiter holds callers to their rates (WithLimiter); nil: none.
	limiter *limit.Limiter
}

// WithPrices sets the price table the runs this client creates journal
// the prices of their models from (run_created.prices), which then price
// every budget check and call of the run whatever a worker's own table
// says (default: the process's table when New is called, provider.Prices:
// the embedded one, or it overridden by PAL_PRICES).
func WithPrices(table event.Prices) Option {
	return func(c *Client) { c.prices = table }
}

// WithAnomalyDefaults sets the settings' anomaly rules (PAL_ANOMALY_*, as
// the CLI parses them) that the runs this client starts record under
// their workflow's own (default: the built-in rules).
func WithAnomalyDefaults(rules map[string]event.AnomalyRule) Option {
	return func(c *Client) { c.anomalies = rules }
}

// Option configures a Client.
type Option func(*Client)

// WithConn sets the connection cancels are announced on (default: the
// store's).
func WithConn(nc *nats.Conn) Option { return func(c *Client) { c.nc = nc } }

// WithReplyPrefixes adds subject prefixes a command's reply subject may
// start with, besides "_INBOX." (PAL_REPLY_PREFIX).
func WithReplyPrefixes(prefixes ...string) Option {
	return func(c *Client) {
		for _, p := range prefixes {
			if p = strings.TrimSpace(p); p != "" {
				c.reply = append(c.reply, p)
			}
		}
	}
}

// New returns a Client over the journal.
func New(store *eventstore.Store, opts ...Option) *Client {
	c := &Client{store: store, reply: []string{DefaultReplyPrefix}, prices: provider.Prices()}
	if store != nil {
		c.nc = store.JetStream().Conn()
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Conn returns the connection cancels and refusals are announced on.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Store returns the journal the client writes to.
func (c *Client) Store() *eventstore.Store { return c.store }

// maxConflictTries bounds how often an input is re-decided after the run
// moved on under it.
const maxConflictTries = 10

// appendInput is the one read → fold → decide → fenced append loop of the
// command side. decide looks at the current state and returns the event
// to append, or an error (nothing is written). A conflict means the run
// moved on meanwhile: the state is read again and decide asked again.
func (c *Client) appendInput(ctx context.Context, runID, what string, decide func(*engine.RunState) (event.Event, error)) (*engine.RunState, error) {
	for tries := 0; ; tries++ {
		evs, head, err := c.store.Read(ctx, runID)
		var cerr *event.CorruptError
		if errors.As(err, &cerr) && !cerr.AfterEnd {
			// The run is over (failed, journal_corrupt); seal its journal
			// so it says so, as the worker that finds it would.
			_, _, serr := c.store.Seal(ctx, runID, head, cerr, "pal")
			if errors.Is(serr, eventstore.ErrConflict) && tries < maxConflictTries {
				continue
			}
		}
		st, err := engine.FoldRead(evs, err)
		if err != nil {
			return nil, fmt.Errorf("%s in run %s: %w", what, runID, err)
		}
		if st.Status.Terminal() {
			return nil, fmt.Errorf("%s in run %s: %w (%s)", what, runID, ErrRunFinished, st.Status)
		}
		ev, err := decide(st)
		if err != nil {
			return nil, err
		}
		_, err = c.store.Append(ctx, runID, head, ev)
		if errors.Is(err, eventstore.ErrConflict) && tries < maxConflictTries {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s in run %s: %w", what, runID, err)
		}
		return st, nil
	}
}

// Cancel appends run_cancelled to a running, waiting or queued run,
// exactly once: concurrent cancels and the run's own end race on the
// fenced append, and only one terminal event can win. The cancel is
// announced on pal.ctl.cancel.<run_id> so the driving worker stops its
// in-flight call; child runs are cancelled with their parent.
//
// Errors: *InputError, ErrRunNotFound, ErrRunFinished, *limit.Error
// (nothing is written).
func (c *Client) Cancel(ctx context.Context, cmd CancelCommand) error {
	if err := c.admit(ctx, CmdCancel, limit.Command, cmd.By); err != nil {
		return err
	}
	return c.cancel(ctx, cmd)
}

// cancel is Cancel, the caller's limit spent: a run's children are
// cancelled as part of it.
func (c *Client) cancel(ctx context.Context, cmd CancelCommand) (err error) {
	defer observeRefusal(CmdCancel, &err)
	if err := cmd.Validate(); err != nil {
		return err
	}
	by := cmd.By
	if by == "" {
		by = "pal"
	}
	st, err := c.appendInput(ctx, cmd.RunID, "cancelling", func(*engine.RunState) (event.Event, error) {
		ev := event.MustNew(event.RunCancelled, "", 0, event.RunCancelledData{Reason: cmd.Reason, By: by})
		ev.WorkerID = by
		return ev, nil
	})
	if err != nil {
		return err
	}
	if c.nc != nil {
		_ = c.nc.Publish(eventstore.CancelPrefix+cmd.RunID, nil)
	}
	for _, id := range st.Order {
		if child := st.Steps[id].ChildRunID; child != "" {
			err := c.cancel(ctx, CancelCommand{RunID: child, Reason: "parent run " + cmd.RunID + " cancelled", By: by})
			if err != nil && !errors.Is(err, ErrRunFinished) && !errors.Is(err, ErrRunNotFound) {
				return fmt.Errorf("cancelling child run %s: %w", child, err)
			}
		}
	}
	return nil
}

// Approve records a decision on an approval step, or on a step parked by
// its confidence gate (onLow "approval"): it appends
// approval_received (fenced; concurrent decisions cannot both land) and
// wakes the run if it is parked. A decision for a step the run has not
// reached yet is kept in the journal and applied when it gets there.
//
// Errors: *InputError (including an approver the step does not list),
// ErrRunNotFound, ErrRunFinished, ErrNotWaiting (not an approval step, or
// already decided). Nothing is written when it fails.
func (c *Client) Approve(ctx context.Context, cmd ApproveCommand) (err error) {
	if err := c.admit(ctx, CmdApprove, limit.Command, cmd.Approver); err != nil {
		return err
	}
	defer observeRefusal(CmdApprove, &err)
	if err := cmd.Validate(); err != nil {
		return err
	}
	st, err := c.appendInput(ctx, cmd.RunID, "approving step "+cmd.StepID, func(st *engine.RunState) (event.Event, error) {
		if p := st.Pause; p != nil && p.Reason == event.WaitAnomaly && p.StepID == cmd.StepID && p.Rejected == nil {
			// The run is paused at an anomaly: the decision is whether it
			// goes on.
			decision := event.DecisionReject
			if cmd.Decision == "approve" {
				decision = event.DecisionApprove
			}
			ev := event.MustNew(event.ApprovalReceived, cmd.StepID, 0, event.ApprovalReceivedData{
				Decision: decision, Approver: cmd.Approver, Comment: cmd.Comment})
			ev.WorkerID = cmd.Approver
			return ev, nil
		}
		var node *workflow.Node
		if st.Workflow != nil {
			node, _ = engine.NodeForStep(st.Workflow, cmd.StepID)
		}
		// An approval step, or a step its confidence gate parked for an
		// approver to accept or reject its low score.
		gate := engine.WaitsOnGate(st, cmd.StepID)
		if !gate && (node == nil || node.Type != workflow.TypeApproval) {
			return event.Event{}, fmt.Errorf("approving step %s of run %s: %w: it is not an approval step", cmd.StepID, cmd.RunID, ErrNotWaiting)
		}
		if d, ok := st.Decisions[cmd.StepID]; ok {
			return event.Event{}, fmt.Errorf("approving step %s of run %s: %w: %s decided already (%s)", cmd.StepID, cmd.RunID, ErrNotWaiting, d.Approver, d.Decision)
		}
		if s, ok := st.Steps[cmd.StepID]; ok && s.Status == engine.StepCompleted {
			return event.Event{}, fmt.Errorf("approving step %s of run %s: %w: the step is complete", cmd.StepID, cmd.RunID, ErrNotWaiting)
		}
		if !gate {
			if d, err := node.Approval(); err == nil && len(d.Approvers) > 0 && !slices.Contains(d.Approvers, cmd.Approver) {
				return event.Event{}, &InputError{Field: "approver", Msg: fmt.Sprintf("%q may not decide step %s (approvers: %s)", cmd.Approver, cmd.StepID, strings.Join(d.Approvers, ", "))}
			}
		}

		decision := event.DecisionReject
		if cmd.Decision == "approve" {
			decision = event.DecisionApprove
		}
		ev := event.MustNew(event.ApprovalReceived, cmd.StepID, 0, event.ApprovalReceivedData{
			Decision: decision, Approver: cmd.Approver, Comment: cmd.Comment})
		ev.WorkerID = cmd.Approver
		return ev, nil
	})
	if err != nil {
		return err
	}
	if st.Status == engine.StatusWaiting {
		return c.store.Enqueue(ctx, st.Created.Queue, cmd.RunID, "approve")
	}
	return nil
}

// RaiseBudget adds to a run's budget: it appends budget_raised (fenced)
// and wakes the run if it is parked. Only limits the run has grow.
//
// Errors: *InputError (nothing to add, or an add to a limit the run does
// not have), ErrRunNotFound, ErrRunFinished. Nothing is written when it
// fails.
func (c *Client) RaiseBudget(ctx context.Context, cmd BudgetCommand) (err error) {
	if err := c.admit(ctx, CmdBudget, limit.Command, cmd.By); err != nil {
		return err
	}
	defer observeRefusal(CmdBudget, &err)
	if err := cmd.Validate(); err != nil {
		return err
	}
	by := cmd.By
	if by == "" {
		by = "pal"
	}
	st, err := c.appendInput(ctx, cmd.RunID, "raising the budget", func(st *engine.RunState) (event.Event, error) {
		b := st.Budget
		if b == nil {
			return event.Event{}, &InputError{Field: "run_id", Msg: fmt.Sprintf("run %s has no budget to raise", cmd.RunID)}
		}
		for _, f := range []struct {
			field string
			add   bool
			limit bool
		}{{"add_usd", cmd.AddUSD > 0, b.MaxCostUSD > 0}, {"add_tokens", cmd.AddTokens > 0, b.MaxTokens > 0},
			{"add_steps", cmd.AddSteps > 0, b.MaxSteps > 0}, {"add_ms", cmd.AddMs > 0, b.MaxDurationMs > 0}} {
			if f.add && !f.limit {
				return event.Event{}, &InputError{Field: f.field, Msg: fmt.Sprintf("run %s has no such limit to raise", cmd.RunID)}
			}
		}
		ev := event.MustNew(event.BudgetRaised, "", 0, event.BudgetRaisedData{AddUSD: cmd.AddUSD, AddTokens: cmd.AddTokens,
			AddSteps: cmd.AddSteps, AddMs: cmd.AddMs, By: by})
		ev.WorkerID = by
		return ev, nil
	})
	if err != nil {
		return err
	}
	if st.Status == engine.StatusWaiting {
		return c.store.Enqueue(ctx, st.Created.Queue, cmd.RunID, "budget")
	}
	return nil
}

// Signal appends signal_received to a run (fenced, an input like a
// decision) and wakes it if it is parked. A signal is kept until a wait
// node of its name takes it, oldest first, so one sent before the run
// reaches the node is not lost; each is taken once.
//
// Errors: *InputError, ErrRunNotFound, ErrRunFinished, ErrNotWaiting (no
// wait node of the workflow waits for the name, or MaxPendingSignals of
// it are pending already). Nothing is written when it fails.
func (c *Client) Signal(ctx context.Context, cmd SignalCommand) (err error) {
	if err := c.admit(ctx, CmdSignal, limit.Command, cmd.By); err != nil {
		return err
	}
	defer observeRefusal(CmdSignal, &err)
	if err := cmd.Validate(); err != nil {
		return err
	}
	payload := bytes.TrimSpace(cmd.Payload)
	if len(payload) == 0 {
		payload = []byte("null")
	}
	by := cmd.By
	if by == "" {
		by = "pal"
	}
	st, err := c.appendInput(ctx, cmd.RunID, "signalling", func(st *engine.RunState) (event.Event, error) {
		if st.Workflow == nil || !st.Workflow.WaitsFor(cmd.Signal) {
			return event.Event{}, fmt.Errorf("signalling run %s: %w: no wait node waits for signal %q", cmd.RunID, ErrNotWaiting, cmd.Signal)
		}
		if n := st.PendingSignals(cmd.Signal); n >= MaxPendingSignals {
			return event.Event{}, fmt.Errorf("signalling run %s: %w: %d signals %q are pending already (the limit)", cmd.RunID, ErrNotWaiting, n, cmd.Signal)
		}
		ev := event.MustNew(event.SignalReceived, "", 0, event.SignalReceivedData{
			Signal: cmd.Signal, Payload: json.RawMessage(payload), By: by})
		ev.WorkerID = by
		return ev, nil
	})
	if err != nil {
		return err
	}
	if st.Status == engine.StatusWaiting {
		return c.store.Enqueue(ctx, st.Created.Queue, cmd.RunID, "signal")
	}
	return nil
}

// Get folds a run's journal into its RunView: always current, no read
// side involved. Errors: *InputError, ErrRunNotFound.
func (c *Client) Get(ctx context.Context, runID string) (*RunView, error) {
	if err := checkRunID("run_id", runID); err != nil {
		return nil, err
	}
	st, err := c.fold(ctx, runID)
	if err != nil {
		return nil, err
	}
	return ViewOf(st), nil
}

// fold reads and folds a run. A journal that does not verify reads as
// failed (journal_corrupt) whether or not a worker has sealed it yet; Get
// writes nothing.
func (c *Client) fold(ctx context.Context, runID string) (*engine.RunState, error) {
	evs, _, err := c.store.Read(ctx, runID)
	if err != nil && !errors.Is(err, event.ErrJournalCorrupt) {
		return nil, err
	}
	st, err := engine.FoldRead(evs, err)
	if err != nil {
		return nil, fmt.Errorf("reading run %s: %w", runID, err)
	}
	return st, nil
}
