package workers

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/telemetry"
)

// The steps of a run in flight at once (docs/architecture.md §10.3).
//
// engine.Frontier gives the drive every step that is ready. The drive
// starts them in order, up to the run's limit (policy.concurrency, capped
// by the worker's RunConcurrency): each one's step_started is emitted, one
// flush makes them all durable (the barrier), and then each runs in a
// goroutine of its own, a branch. The drive's goroutine stays the run's
// one writer: a branch hands it what must be durable before the branch
// goes on (a delivery's claim, a child's creation: call.journal) and its
// outcome (a branchResult), which the drive folds, batches into its next
// flush, and asks Frontier again. Steps that act on nothing outside the
// process (pure steps, gates, waits, a claimed delivery) run on the
// drive's goroutine, and so does a process step, alone: its sub-step
// reports are journaled by the drive while it runs. A run parks only
// when nothing is in flight.
//
// When a step fails the run (engine.Fail), the branches in flight are
// interrupted: their contexts are cancelled, the drive waits for each to
// return, and journals it as step_failed class interrupted (outcome
// unknown, interrupted_by the step that failed the run) before run_failed,
// so no step is left started without an outcome. A step that finished
// anyway (a claimed delivery is let finish) is journaled as it ended.

// The worker's cap on a run's steps in flight.
const (
	// EnvRunConcurrency names the cap on how many steps of one run a
	// worker has in flight at once (Config.RunConcurrency).
	EnvRunConcurrency = "PAL_RUN_CONCURRENCY"
	// DefaultRunConcurrency is that cap when the setting is unset.
	DefaultRunConcurrency = 32
)

// errInterrupted cancels the branches in flight when a step beside them
// fails the run; errDriveOver when the drive ends.
var (
	errInterrupted = errors.New("a step beside it failed the run")
	errDriveOver   = errors.New("the drive ended")
)

// abortError is a branch's error that is not its step's outcome: the
// drive could not journal for it, or could not create its child. The
// drive ends with it, and the next drive resumes the step.
type abortError struct{ err error }

func (e *abortError) Error() string { return e.err.Error() }
func (e *abortError) Unwrap() error { return e.err }

// flight is what a drive has in flight.
type flight struct {
	// limit is how many branches may be in flight at once.
	limit    int
	branches map[string]*branch
	// results has room for every branch, so a branch never waits to
	// report (the drive may have stopped listening).
	results chan branchResult
	calls   chan driveCall
	// waiting are the subagent steps found waiting in this drive for a
	// child that cannot go on yet: not looked at again in this drive.
	waiting map[string]bool
	// due is when the first retry held back by its backoff may start
	// (zero: none is).
	due time.Time
	wg  sync.WaitGroup
}

// branch is one step in flight in a goroutine of its own.
type branch struct {
	cancel context.CancelCauseFunc
	span   *telemetry.Step
}

// branchResult is how a branch's step ended.
type branchResult struct {
	p    engine.StepPlan
	res  stepResult
	err  error
	took time.Duration
	// panicked holds what the branch panicked with, and its stack.
	panicked any
	stack    []byte
}

// driveCall is a branch's request to run fn on the drive's goroutine.
type driveCall struct {
	fn   func() error
	done chan error
}

// runLimit is how many steps of the run may be in flight at once: the
// workflow's policy.concurrency, capped by the worker's RunConcurrency.
func (d *drive) runLimit() int {
	return max(min(d.st.Workflow.Concurrency(), d.w.cfg.RunConcurrency), 1)
}

func newFlight(limit int) *flight {
	return &flight{limit: limit, branches: map[string]*branch{}, results: make(chan branchResult, limit),
		calls: make(chan driveCall), waiting: map[string]bool{}}
}

// busy names the steps in flight, for engine.Frontier.
func (f *flight) busy() map[string]bool {
	if len(f.branches) == 0 {
		return nil
	}
	m := make(map[string]bool, len(f.branches))
	for id := range f.branches {
		m[id] = true
	}
	return m
}

// runSteps carries out a RunSteps: it starts what it may, or waits for
// what is in flight, or parks the run when nothing is and every step
// waits for an outside input.
func (d *drive) runSteps(plans []engine.StepPlan) error {
	progressed, err := d.dispatch(plans)
	if err != nil || progressed {
		return err
	}
	if len(d.fly.branches) > 0 || !d.fly.due.IsZero() {
		return d.await()
	}
	if err := d.flush(); err != nil {
		return err
	}
	return errParked
}

// dispatch starts the plans in order: on the drive's goroutine those
// that act on nothing outside it, in branches the others, up to the
// limit. It reports whether anything was done, so that Frontier is asked
// again.
func (d *drive) dispatch(plans []engine.StepPlan) (bool, error) {
	d.fly.due = time.Time{}
	now := d.w.now()
	var starts []*call
	progressed := false
	for _, p := range plans {
		switch {
		case p.Wait != nil && p.Wait.Waiting, d.fly.waiting[p.StepID]:
			continue // waits for an outside input
		case p.NotBefore.After(now):
			if d.fly.due.IsZero() || p.NotBefore.Before(d.fly.due) {
				d.fly.due = p.NotBefore // a retry's backoff
			}
			continue
		case p.Wait != nil, p.Gate != nil, p.Pure, p.Exec == engine.ExecConnector && (p.Claimed || p.Delivered):
			if err := d.runHere(p); err != nil {
				return true, err
			}
			progressed = true
			continue
		case p.Exec == engine.ExecProcess:
			if len(d.fly.branches)+len(starts) > 0 {
				continue // a process step runs alone
			}
			return true, d.runAlone(p)
		case p.Exec == engine.ExecSubagent && p.Started && d.st.Steps[p.StepID].Status == engine.StepWaiting &&
			!d.w.childMayProceed(d.ctx, p.ChildRunID):
			d.fly.waiting[p.StepID] = true
			continue
		case len(d.fly.branches)+len(starts) >= d.fly.limit:
			continue
		}
		progressed = true
		if c, err := d.starting(p); err != nil {
			if err := d.journalOutcome(p, stepResult{}, err, 0); err != nil {
				return true, err
			}
		} else if c != nil {
			starts = append(starts, c)
		}
	}
	if len(starts) == 0 {
		return progressed, nil
	}
	// Barrier: every step_started is durable before any step acts.
	if err := d.flush(); err != nil {
		return true, err
	}
	for _, c := range starts {
		d.launch(c)
	}
	return true, nil
}

// starting emits the step_started of p and gives the call that will run
// it: nil when the step failed at once (its input cannot be journaled),
// an error when it cannot start (a child workflow that does not
// validate), which is the step's outcome.
func (d *drive) starting(p engine.StepPlan) (*call, error) {
	if !d.prepare(p) {
		return nil, nil
	}
	c := &call{d: d, p: p, prices: d.st.Prices(), deployed: d.st.Created.Deployed, thread: d.st.Created.Thread}
	if p.Exec == engine.ExecLLM {
		c.deltas = d.deltas(p)
		if namesBlob(p.Call()) {
			c.held = d.heldValues()
		}
	}
	if p.Exec == engine.ExecSubagent {
		ev, err := d.childCreated(p)
		if err != nil {
			return nil, err
		}
		c.child = ev
	}
	return c, nil
}

// launch runs c in a branch of its own.
func (d *drive) launch(c *call) {
	p := c.p
	ctx, span := telemetry.StartStep(d.ctx, d.runID, p.StepID, p.Attempt, p.NodeType)
	ctx, cancel := context.WithCancelCause(ctx)
	c.ctx = ctx
	d.fly.branches[p.StepID] = &branch{cancel: cancel, span: span}
	d.fly.wg.Add(1)
	go func() {
		defer d.fly.wg.Done()
		r := branchResult{p: p}
		start := time.Now()
		defer func() {
			if v := recover(); v != nil {
				r.panicked, r.stack = v, debug.Stack()
			}
			r.took = time.Since(start)
			d.fly.results <- r
		}()
		r.res, r.err = c.execute()
	}()
}

// await waits for what is in flight (or the first retry's backoff), and
// journals every result that has come: the next flush carries them all.
func (d *drive) await() error {
	// What came before is durable before the drive waits.
	if err := d.flush(); err != nil {
		return err
	}
	var due <-chan time.Time
	if !d.fly.due.IsZero() {
		t := time.NewTimer(max(d.fly.due.Sub(d.w.now()), 0))
		defer t.Stop()
		due = t.C
	}
	select {
	case r := <-d.fly.results:
		if err := d.land(r); err != nil {
			return err
		}
	case c := <-d.fly.calls:
		c.done <- c.fn()
	case <-due:
		return nil
	case <-d.ctx.Done():
		return context.Cause(d.ctx)
	}
	for {
		select {
		case r := <-d.fly.results:
			if err := d.land(r); err != nil {
				return err
			}
		case c := <-d.fly.calls:
			c.done <- c.fn()
		default:
			return nil
		}
	}
}

// land journals how a branch's step ended.
func (d *drive) land(r branchResult) error {
	p := r.p
	b := d.fly.branches[p.StepID]
	delete(d.fly.branches, p.StepID)
	var err error
	var wait *childWaitError
	var abort *abortError
	switch {
	case r.panicked != nil:
		err = d.branchPanicked(r)
	case context.Cause(d.ctx) != nil:
		err = context.Cause(d.ctx) // the drive ends (lease lost, shutdown): journal nothing more
	case errors.As(r.err, &abort):
		err = abort.err
	case errors.As(r.err, &wait):
		err = d.childWaits(p, wait.why)
	default:
		err = d.journalOutcome(p, r.res, r.err, r.took)
	}
	b.span.End(d.stepOutcome(p, err))
	return err
}

// branchPanicked ends the drive with a branch's panic, as a panic of the
// drive's own would (safeRun).
func (d *drive) branchPanicked(r branchResult) error {
	seq, n := msgIDs(d.lease.msg)
	d.log.Error("drive panicked", "step_id", r.p.StepID, "work_seq", seq, "delivery", n, "resumed", d.token.resumed,
		"panic", r.panicked, "stack", string(r.stack))
	return &panicError{value: r.panicked, counted: d.token.resumed}
}

// interrupt stops what is in flight because the step by failed the run:
// each branch is cancelled and, once it has returned, journaled as
// interrupted (or as it ended, if it finished anyway); then every step
// still started without an outcome (one an earlier drive started and this
// one had not sent again) is journaled as interrupted too.
func (d *drive) interrupt(by string) {
	for _, b := range d.fly.branches {
		b.cancel(errInterrupted)
	}
	for len(d.fly.branches) > 0 {
		select {
		case r := <-d.fly.results:
			b := d.fly.branches[r.p.StepID]
			delete(d.fly.branches, r.p.StepID)
			if r.err == nil && r.panicked == nil {
				_ = d.journalOutcome(r.p, r.res, nil, r.took)
			} else {
				d.interrupted(r.p.StepID, r.p.Attempt, by, r.took)
			}
			b.span.End(d.stepOutcome(r.p, nil))
		case c := <-d.fly.calls:
			c.done <- errInterrupted // nothing more is claimed or created
		}
	}
	for _, id := range d.st.Order {
		if s := d.st.Steps[id]; s.Status == engine.StepRunning {
			d.interrupted(id, s.Attempt, by, 0)
		}
	}
}

// interrupted journals that step id's attempt was cut short because the
// step by failed the run: its outcome is unknown.
func (d *drive) interrupted(id string, attempt int, by string, took time.Duration) {
	msg := "interrupted: the run failed"
	if by != "" {
		msg = fmt.Sprintf("interrupted: step %s failed the run", by)
	}
	d.emit(event.StepFailed, id, attempt, event.StepFailedData{Error: msg, Class: event.ClassInterrupted,
		DurationMs: took.Milliseconds(), OutcomeUnknown: true, InterruptedBy: by})
}

// stop ends the flight when the drive ends: every branch is cancelled and
// waited for; nothing more is journaled.
func (f *flight) stop() {
	for _, b := range f.branches {
		b.cancel(errDriveOver)
	}
	done := make(chan struct{})
	go func() {
		f.wg.Wait()
		close(done)
	}()
	for {
		select {
		case r := <-f.results:
			if b := f.branches[r.p.StepID]; b != nil {
				b.span.End("interrupted")
				delete(f.branches, r.p.StepID)
			}
		case c := <-f.calls:
			c.done <- errDriveOver
		case <-done:
			for len(f.results) > 0 {
				if r := <-f.results; f.branches[r.p.StepID] != nil {
					f.branches[r.p.StepID].span.End("interrupted")
				}
			}
			clear(f.branches)
			return
		}
	}
}
