package workers

import (
	"errors"
	"fmt"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/telemetry"
)

// driveToken is what the resume job holds of a drive: its run_resumed,
// the fencing token, and the trace that run_resumed names.
type driveToken struct {
	// landed is called once this drive's run_resumed is in the journal
	// (resume, flush).
	landed func()
	// resumed: this drive's run_resumed is in the journal, so the next
	// drive counts a crash of this one toward crash_loop.
	resumed bool
	// tries counts resumes after a stale writer's append beat
	// run_resumed (resumeAgain).
	tries int
	// trace is the drive's trace, opened by resume; nil until then (and
	// a no-op with tracing off). earlier holds the trace ids the run's
	// earlier drives journaled on their run_resumed, oldest first.
	trace   *telemetry.Drive
	earlier []string
}

// resume queues run_resumed, the fencing token of this drive, for the
// next flush (carriesResumed says which); nothing acts outside the process
// before it is in the journal. A run whose drives keep crashing without
// progress fails instead.
func (d *drive) resume() {
	crashed := d.st.DriveOpen
	crashes := 0
	if crashed {
		crashes = d.st.CrashesAtStep + 1
	}
	info := telemetry.DriveInfo{RunID: d.runID, Worker: d.w.cfg.ID, ResumeCount: d.st.Resumes + 1,
		Crashed: crashed, Earlier: d.token.earlier}
	if d.token.trace == nil {
		// The drive's trace opens here, so its id is on run_resumed.
		d.ctx, d.token.trace = telemetry.StartDrive(d.ctx, info)
	}
	lastEvent := d.st.UpdatedAt
	first := d.st.Resumes == 0
	d.emit(event.RunResumed, "", 0, event.RunResumedData{
		Worker: d.w.cfg.ID, ResumeCount: d.st.Resumes + 1, Crashed: crashed, CrashesAtStep: crashes})
	dctx := d.ctx // the resume span is the drive's, not the step's that lands it
	d.token.landed = func() {
		d.token.resumed = true
		d.token.trace.Resumed(dctx, info)
		if first {
			telemetry.RunStarted()
		}
		if crashed {
			telemetry.Takeover(d.w.now().Sub(lastEvent))
			d.log.Info("resuming run after an interrupted drive", "resume", d.st.Resumes, "seq", d.head.Seq)
		}
	}
	if crashes >= d.w.cfg.MaxCrashes {
		step := d.currentStep()
		d.emit(event.RunFailed, "", 0, event.RunFailedData{Code: event.CodeCrashLoop, StepID: step,
			Error: fmt.Sprintf("run crashed its workers %d times in a row without completing a step (at step %q); giving up", crashes, step)})
	}
}

// resumePending reports whether this drive's run_resumed is queued and
// not yet in the journal: resume queues it first, so it leads the pending
// events until a flush lands it.
func (d *drive) resumePending() bool {
	return len(d.pending) > 0 && d.pending[0].Kind == event.RunResumed
}

// carriesResumed says whether a, the drive's first action, may take the
// pending run_resumed along in its own first flush: a set of steps
// flushes every step_started before any of them acts outside the process
// (or fails, completes a pure step or waits, without acting), so
// run_resumed and the step_started go as one message (one fsync in strict
// mode) and nothing outside the process has seen the drive before its
// token is in the journal. Any other action flushes run_resumed first.
func carriesResumed(a engine.Action) bool {
	_, ok := a.(engine.RunSteps)
	return ok
}

// errResumeConflict: a flush that carried this drive's run_resumed found
// the journal moved: a stale writer's append came before the token.
var errResumeConflict = errors.New("an append beat run_resumed")

// resumeAgain takes err from a flush: when it is errResumeConflict, the
// drive still holds the lease, so it reloads the journal and resumes
// again (twice at most), and the caller decides afresh. Any other error is
// returned as it is.
func (d *drive) resumeAgain(err error) error {
	if !errors.Is(err, errResumeConflict) {
		return err
	}
	if d.token.tries >= 2 {
		return err
	}
	d.token.tries++
	if err := d.load(); err != nil { // which drops what is pending
		return err
	}
	if d.st.Status.Terminal() || d.st.Status == engine.StatusWaiting {
		return nil
	}
	d.resume()
	return nil
}

func (d *drive) currentStep() string {
	for i := len(d.st.Order) - 1; i >= 0; i-- {
		if s := d.st.Steps[d.st.Order[i]]; s.Status != engine.StepCompleted {
			return s.ID
		}
	}
	return ""
}
