package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/workflow"
)

// A subagent step creates its child run (its id is derived from this run
// and step, so a re-driven parent adopts the child it created before a
// crash), drives the child in a branch of this drive, and completes with
// the child's outcome. The child's run_created is built by the drive when
// the step starts (childCreated: it draws on the parent's budget, which
// is the drive's state); the branch appends it, has the drive journal
// child_run_created, and drives the child (runChild). A child that parks
// (an approval), or that another worker drives, leaves the step waiting
// for it (childWaitError); the child's end wakes the parent.

// childCreated is the run_created of the child a subagent step starts
// with: nil when the step created its child before. A workflow that does
// not validate fails the step (permanently).
func (d *drive) childCreated(p engine.StepPlan) (*event.Event, error) {
	if s := d.st.Steps[p.StepID]; s != nil && s.ChildRunID != "" {
		return nil, nil
	}
	var in engine.SubagentInput
	if err := json.Unmarshal(p.Input, &in); err != nil {
		return nil, permanent("step %s: bad input: %v", p.StepID, err)
	}
	def, queue, deployed, err := d.childWorkflow(p, in)
	if err != nil {
		return nil, err
	}
	wf, err := workflow.ParseCached(def)
	if err != nil {
		return nil, permanent("step %s: child workflow: %v", p.StepID, err)
	}
	ev, err := engine.ChildRunCreated(d.st, p.StepID, wf, in.Input, queue, deployed, d.w.cfg.AnomalyDefaults, d.w.cfg.ID, d.w.now())
	if err != nil {
		return nil, permanent("step %s: child run_created: %v", p.StepID, err)
	}
	return &ev, nil
}

// childWorkflow is the definition of the child a subagent step starts:
// a subagent node's own (and its queue), or for an agent's workflow tool
// the latest version of the deployed workflow (and that version, which
// the child carries). A workflow tool whose workflow is not deployed
// fails the call: the model sees the error, as for any failed tool.
func (d *drive) childWorkflow(p engine.StepPlan, in engine.SubagentInput) (json.RawMessage, string, *event.Deployed, error) {
	if in.Workflow == "" {
		nd, err := p.Node.Subagent()
		if err != nil {
			return nil, "", nil, permanent("step %s: child workflow: %v", p.StepID, err)
		}
		return nd.Workflow, nd.Queue, nil, nil
	}
	dep, err := d.w.store.DeployedWorkflow(d.ctx, in.Workflow, 0)
	switch {
	case errors.Is(err, eventstore.ErrWorkflowNotFound), errors.Is(err, event.ErrInvalidWorkflowName):
		return nil, "", nil, permanent("step %s: workflow tool %q: %v", p.StepID, in.Workflow, err)
	case err != nil:
		return nil, "", nil, err
	}
	return dep.Definition, "", &dep.Deployed, nil
}

// childWaitError: the child run is not over (it waits, or another worker
// drives it): the step waits for it.
type childWaitError struct{ why string }

func (e *childWaitError) Error() string { return "the child run is not over: " + e.why }

// runChild creates the step's child unless it exists, and drives it
// inline: the step's outcome is the child's, its usage the child's spend.
func (c *call) runChild() (stepResult, error) {
	p := c.p
	if c.child != nil {
		if err := c.createChild(); err != nil {
			return stepResult{}, &abortError{err: err}
		}
		if err := c.journal(func() error {
			c.d.emit(event.ChildRunCreated, p.StepID, p.Attempt, event.ChildRunCreatedData{ChildRunID: p.ChildRunID})
			return c.d.flush()
		}); err != nil {
			return stepResult{}, &abortError{err: err}
		}
	}
	// A child on a queue this worker does not serve is its queue's
	// workers' to drive: queued there, the step waits for it, and its end
	// wakes this run (afterDrive).
	q, err := c.childQueue()
	if err != nil {
		return stepResult{}, &abortError{err: err}
	}
	var child *engine.RunState
	if c.d.w.serves(q) {
		child, err = c.d.w.driveInline(c.ctx, p.ChildRunID)
	} else {
		child, err = c.d.w.childEnded(c.ctx, q, p.ChildRunID)
	}
	if cause := context.Cause(c.ctx); cause != nil {
		return stepResult{}, cause
	}
	var wait *childWaitError
	switch {
	case errors.Is(err, eventstore.ErrLeaseHeld):
		return stepResult{}, &childWaitError{why: "another worker drives it"}
	case errors.As(err, &wait):
		return stepResult{}, err
	case err != nil:
		return stepResult{}, &abortError{err: err}
	}
	// The child's spend is the parent's: the step carries it, so the
	// parent's journal alone says what the run spent.
	var usage *event.Usage
	if u := child.Usage; u != (event.Usage{}) {
		usage = &u
	}
	switch child.Status {
	case engine.StatusSucceeded:
		out := child.Output
		if len(out) == 0 {
			out = json.RawMessage("null")
		}
		return stepResult{output: out, usage: usage}, nil
	case engine.StatusFailed, engine.StatusCancelled:
		return stepResult{usage: usage}, permanent("child run %s %s: %s", p.ChildRunID, child.Status, child.Error)
	default:
		return stepResult{}, &childWaitError{why: string(child.Status)}
	}
}

// childEnded reads the state of a child on queue q, which this worker
// does not serve: an ended child's is the step's outcome; one that has
// not ended is queued there (a no-op while its work is pending) and the
// step waits (*childWaitError) until its end wakes the parent.
func (w *Worker) childEnded(ctx context.Context, q, childID string) (*engine.RunState, error) {
	evs, _, err := w.store.Read(ctx, childID)
	if err != nil && !errors.Is(err, event.ErrJournalCorrupt) {
		return nil, err
	}
	st, err := engine.FoldRead(evs, err) // a corrupt child reads failed
	if err != nil {
		return nil, err
	}
	if st.Status.Terminal() {
		return st, nil
	}
	if err := w.store.Enqueue(ctx, q, childID, "child"); err != nil {
		return nil, err
	}
	return nil, &childWaitError{why: "queued on " + q}
}

// childQueue is the queue of the step's child: its run_created's, just
// made or read back (one Get) when the child was created before.
func (c *call) childQueue() (string, error) {
	if c.child != nil {
		var d event.RunCreatedData
		if err := c.child.DecodeData(&d); err != nil {
			return "", err
		}
		return event.QueueOr(d.Queue), nil
	}
	return c.d.w.store.QueueOf(c.ctx, c.p.ChildRunID)
}

// childWaits journals that a subagent step waits for its child run (once).
func (d *drive) childWaits(p engine.StepPlan, why string) error {
	if s := d.st.Steps[p.StepID]; s == nil || s.Status != engine.StepWaiting {
		d.emit(event.StepWaiting, p.StepID, p.Attempt, event.StepWaitingData{Reason: event.WaitChild, ChildRunID: p.ChildRunID})
	}
	d.fly.waiting[p.StepID] = true
	d.log.Info("waiting for the child run", "step_id", p.StepID, "child_run_id", p.ChildRunID, "child", why)
	return d.flush()
}

// createChild appends the child's run_created, fenced on an empty subject:
// if the child exists already it is adopted. The child is put in the
// PAL_INFLIGHT index first, as a start puts its run (eventstore.MarkInflight):
// every run is in it from before its run_created to its end, so the sweep
// finds an orphaned child with NATS alone, as it finds any run. A child
// whose entry did not land fails the drive; the re-drive adopts the child
// and puts its entry again.
func (c *call) createChild() error {
	p, store := c.p, c.d.w.store
	q, err := c.childQueue()
	if err != nil {
		return err
	}
	indexed := store.MarkInflight(q, p.ChildRunID)
	_, err = store.Append(c.ctx, p.ChildRunID, eventstore.Head{}, *c.child)
	if errors.Is(err, eventstore.ErrConflict) {
		c.d.log.Info("adopting the child run created before", "child_run_id", p.ChildRunID)
		err = nil
	}
	if ierr := indexed(c.ctx); ierr != nil && err == nil {
		return fmt.Errorf("step %s: child run %s: %w", p.StepID, p.ChildRunID, ierr)
	}
	return err
}

// driveInline drives a child run within its parent's drive: it takes the
// child's lease (waiting at most a TTL for a crashed holder's to expire)
// and runs the same loop, under the same withLease, as any drive. It
// returns the child's state when the drive ends, or eventstore.ErrLeaseHeld
// when another worker drives the child.
func (w *Worker) driveInline(ctx context.Context, runID string) (*engine.RunState, error) {
	d := &drive{w: w, runID: runID, log: w.log.With("run_id", runID, "inline", true), inline: true}
	end := w.withLease(ctx, d, nil)
	if d.st == nil {
		return nil, end.err
	}
	switch end.outcome {
	case driveDone, driveParked, driveEnded:
		return d.st, nil
	case driveLeaseLost, driveFenced:
		// The child's own lease or journal was lost: someone else has it.
		return nil, fmt.Errorf("driving child run %s: %w", runID, eventstore.ErrLeaseHeld)
	default:
		return nil, end.err
	}
}

// childMayProceed reports whether a parent waiting for its child should
// look again: the child ended, or nobody drives it and it is not waiting.
func (w *Worker) childMayProceed(ctx context.Context, childID string) bool {
	evs, _, err := w.store.Read(ctx, childID)
	switch {
	case errors.Is(err, eventstore.ErrRunNotFound):
		return true
	case err != nil && !errors.Is(err, event.ErrJournalCorrupt):
		return false
	}
	st, err := engine.FoldRead(evs, err) // a corrupt child reads failed
	if err != nil {
		return true
	}
	if st.Status.Terminal() {
		return true
	}
	if !w.serves(st.Created.Queue) {
		return false // its queue's workers drive it; its end wakes the parent
	}
	if st.Status == engine.StatusWaiting {
		// The child waits for its own input: wakeable only if that came.
		cd := &drive{w: w, runID: childID, ctx: ctx, st: st}
		return cd.wakeable()
	}
	holder, err := w.leases.Holder(ctx, childID)
	return err == nil && holder == ""
}
