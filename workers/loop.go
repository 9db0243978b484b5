package workers

import (
	"context"
	"errors"
	"fmt"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// run folds the journal, appends the fencing token and drives the run
// until it ends or parks: engine.Frontier says what may go on, and the
// drive starts it, several steps at once (flight.go), and asks again as
// their outcomes come in.
func (d *drive) run() error {
	if err := d.load(); err != nil {
		return err
	}
	if d.st.Status.Terminal() {
		d.log.Debug("nothing to do", "status", d.st.Status)
		return nil
	}
	if d.st.Status == engine.StatusWaiting && !d.wakeable() {
		d.log.Debug("still waiting")
		return errParked
	}
	if d.st.DriveOpen {
		// A drive began after all: its worker may be acting, so this one
		// writes no token before it holds the lease.
		if err := d.awaitLease(); err != nil {
			return err
		}
	}
	d.resume()
	d.fly = newFlight(d.runLimit())
	defer d.fly.stop()
	for {
		if err := d.ctx.Err(); err != nil {
			return context.Cause(d.ctx)
		}
		a := engine.Frontier(d.ctx, d.st.Workflow, d.st, d.w.now(), d.fly.busy())
		if err := d.ctx.Err(); err != nil {
			// An evaluation cut short is no decision: act on none.
			return context.Cause(d.ctx)
		}
		if d.resumePending() && !carriesResumed(a) {
			if err := d.flush(); err != nil {
				if err := d.resumeAgain(err); err != nil {
					return err
				}
				continue
			}
		}
		end, err := d.act(a)
		if end {
			return err
		}
		if err != nil {
			if err := d.resumeAgain(err); err != nil {
				return err
			}
		}
	}
}

// act carries out one action of the engine's. end: the drive is over,
// with err; otherwise err, if any, is a flush's that resumeAgain may
// answer.
func (d *drive) act(a engine.Action) (end bool, err error) {
	switch a := a.(type) {
	case engine.Done:
		return true, d.flush()
	case engine.Complete:
		if err := d.releaseThread(); err != nil {
			return true, err
		}
		d.emit(event.RunSucceeded, "", 0, event.RunSucceededData{Output: a.Output})
		return true, d.flush()
	case engine.Fail:
		d.interrupt(a.StepID)
		if err := d.releaseThread(); err != nil {
			return true, err
		}
		d.emit(event.RunFailed, "", 0, event.RunFailedData{Error: a.Error, Code: a.Code, StepID: a.StepID, Attempts: a.Attempts})
		return true, d.flush()
	case engine.RunSteps:
		err := d.runSteps(a.Plans)
		return errors.Is(err, errParked), err
	case engine.Note:
		// A brake's record (budget_warning, budget_exceeded,
		// anomaly_detected): journaled with what comes next, and Next
		// asked again, which now sees it.
		d.emit(a.Kind, a.StepID, 0, a.Data)
		return false, nil
	case engine.Park:
		if len(d.fly.branches) > 0 {
			// A run parks only when nothing is in flight.
			return false, d.await()
		}
		err := d.park(a)
		return errors.Is(err, errParked), err
	default:
		return true, fmt.Errorf("run %s: unexpected action %T", d.runID, a)
	}
}

// park parks the run on a brake: step_waiting with the brake's reason,
// once; flushing may fold in the input that releases it (a budget_raised,
// an approval) that came meanwhile, so Next decides again before the
// drive ends.
func (d *drive) park(p engine.Park) error {
	if !p.Waiting {
		d.log.Info("run paused by its brakes", "reason", p.Reason, "step_id", p.StepID)
		d.emit(event.StepWaiting, p.StepID, 0, event.StepWaitingData{Reason: p.Reason})
		return d.flush()
	}
	if err := d.flush(); err != nil {
		return err
	}
	return errParked
}

// wakeable reports whether a waiting run has something to do now: a
// decision arrived, a wait timed out (Next decides that, at the worker's
// clock), or a child it waits for can go on or has ended.
func (d *drive) wakeable() bool {
	a := engine.Frontier(d.ctx, d.st.Workflow, d.st, d.w.now(), nil)
	switch a := a.(type) {
	case engine.Park:
		return !a.Waiting
	case engine.RunSteps:
		for _, p := range a.Plans {
			if d.mayGoOn(p) {
				return true
			}
		}
		return false
	}
	return true
}

// mayGoOn reports whether a step of a waiting run may go on: it is not a
// wait still waiting, nor a subagent step whose child cannot go on yet.
func (d *drive) mayGoOn(p engine.StepPlan) bool {
	switch {
	case p.Wait != nil && p.Wait.Waiting:
		return false
	case p.Exec == engine.ExecSubagent:
		if s := d.st.Steps[p.StepID]; s != nil && s.Status == engine.StepWaiting {
			return d.w.childMayProceed(d.ctx, p.ChildRunID)
		}
	}
	return true
}
