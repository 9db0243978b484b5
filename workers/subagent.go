package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/workflow"
)

// runSubagent drives a subagent step: it creates the child run (its id is
// derived from this run and step, so a re-driven parent adopts the child it
// created before a crash), drives the child in this drive, and completes
// the step with the child's outcome. A child that parks (an approval) parks
// this run too; the child's end wakes it.
func (d *drive) runSubagent(p engine.StepPlan) error {
	s := d.st.Steps[p.StepID]
	if s != nil && s.Status == engine.StepWaiting && !d.w.childMayProceed(d.ctx, p.ChildRunID) {
		return errParked
	}
	if !p.Started {
		d.emit(event.StepStarted, p.StepID, p.Attempt, event.StepStartedData{
			NodeID: p.NodeID, NodeType: p.NodeType, Input: p.Input, IdempotencyKey: p.Key})
	}
	if s = d.st.Steps[p.StepID]; s.ChildRunID == "" {
		if err := d.createChild(p); err != nil {
			var ve *workflow.ValidationError
			if errors.As(err, &ve) {
				return d.journalOutcome(p, stepResult{}, permanent("step %s: child workflow: %v", p.StepID, err), 0)
			}
			return err
		}
		d.emit(event.ChildRunCreated, p.StepID, p.Attempt, event.ChildRunCreatedData{ChildRunID: p.ChildRunID})
	}
	if err := d.flush(); err != nil {
		return err
	}
	start := time.Now()
	child, err := d.w.driveInline(d.ctx, p.ChildRunID)
	if c := context.Cause(d.ctx); c != nil {
		return c
	}
	switch {
	case errors.Is(err, eventstore.ErrLeaseHeld):
		return d.waitForChild(p, "another worker drives it")
	case err != nil:
		return err
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
		return d.journalOutcome(p, stepResult{output: out, usage: usage}, nil, time.Since(start))
	case engine.StatusFailed, engine.StatusCancelled:
		return d.journalFailure(p, usage, permanent("child run %s %s: %s", p.ChildRunID, child.Status, child.Error), time.Since(start))
	default:
		return d.waitForChild(p, string(child.Status))
	}
}

// waitForChild parks the run until its child run ends.
func (d *drive) waitForChild(p engine.StepPlan, why string) error {
	if s := d.st.Steps[p.StepID]; s == nil || s.Status != engine.StepWaiting {
		d.emit(event.StepWaiting, p.StepID, p.Attempt, event.StepWaitingData{Reason: event.WaitChild, ChildRunID: p.ChildRunID})
	}
	if err := d.flush(); err != nil {
		return err
	}
	d.log.Info("waiting for the child run", "step_id", p.StepID, "child_run_id", p.ChildRunID, "child", why)
	return errParked
}

// createChild appends the child's run_created, fenced on an empty subject:
// if the child exists already it is adopted. The child is put in the
// PAL_INFLIGHT index first, as a start puts its run (eventstore.MarkInflight):
// every run is in it from before its run_created to its end, so the sweep
// finds an orphaned child with NATS alone, as it finds any run. A child
// whose entry did not land fails the drive; the re-drive adopts the child
// and puts its entry again.
func (d *drive) createChild(p engine.StepPlan) error {
	nd, err := p.Node.Subagent()
	if err != nil {
		return err
	}
	wf, err := workflow.ParseCached(nd.Workflow)
	if err != nil {
		return err
	}
	var in engine.SubagentInput
	if err := json.Unmarshal(p.Input, &in); err != nil {
		return permanent("step %s: bad input: %v", p.StepID, err)
	}
	ev, err := engine.ChildRunCreated(d.st, p.StepID, wf, in.Input, d.w.cfg.AnomalyDefaults, d.w.cfg.ID, d.w.now())
	if err != nil {
		return permanent("step %s: child run_created: %v", p.StepID, err)
	}
	indexed := d.w.store.MarkInflight(p.ChildRunID)
	_, err = d.w.store.Append(d.ctx, p.ChildRunID, eventstore.Head{}, ev)
	if errors.Is(err, eventstore.ErrConflict) {
		d.log.Info("adopting the child run created before", "child_run_id", p.ChildRunID)
		err = nil
	}
	if ierr := indexed(d.ctx); ierr != nil && err == nil {
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
	if st.Status == engine.StatusWaiting {
		// The child waits for its own input: wakeable only if that came.
		cd := &drive{w: w, runID: childID, ctx: ctx, st: st}
		return cd.wakeable()
	}
	holder, err := w.leases.Holder(ctx, childID)
	return err == nil && holder == ""
}
