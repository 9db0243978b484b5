package workers

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/redact"
	"github.com/palrun/pal/internal/telemetry"
)

// Default step timeouts when a node sets none.
const (
	defaultLLMTimeout       = 2 * time.Minute
	defaultToolTimeout      = time.Minute
	defaultConnectorTimeout = 30 * time.Second
)

// stepResult is a completed step's journaled outcome.
type stepResult struct {
	output   json.RawMessage
	usage    *event.Usage
	delivery string
	// delivered is a delivery's receipt, journaled before its outcome.
	delivered *event.SideEffectDeliveredData
	// stderr is a process step's stderr tail, journaled with its outcome.
	stderr string
	// confidence is the score of a gated LLM step's answer: journaled
	// before anything else, its verdict is then planned like a replay's.
	confidence *event.ConfidenceEvaluatedData
	// final: an LLM answer with no tool calls (an agent's last turn).
	final bool
}

// spanned runs one step attempt on the drive's goroutine under the
// attempt's span; the span's end counts the attempt (pal_steps_total by
// node type and outcome). A step in a branch of its own has its span
// opened and ended by the flight (flight.go).
func (d *drive) spanned(p engine.StepPlan, run func() error) error {
	outer := d.ctx
	ctx, span := telemetry.StartStep(d.ctx, d.runID, p.StepID, p.Attempt, p.NodeType)
	d.ctx = ctx
	err := run()
	d.ctx = outer
	span.End(d.stepOutcome(p, err))
	return err
}

// stepOutcome names how a step attempt ended: as the state has it after
// the attempt, or waiting (parked), or interrupted (the drive ended first,
// or a step beside it failed the run).
func (d *drive) stepOutcome(p engine.StepPlan, err error) string {
	switch {
	case errors.Is(err, errParked):
		return "waiting"
	case err != nil:
		return "interrupted"
	}
	s := d.st.Steps[p.StepID]
	if s == nil {
		return "failed" // failed before it could be journaled as started
	}
	switch {
	case s.Status == engine.StepFailed && s.Class == event.ClassInterrupted:
		return "interrupted"
	case s.Status == engine.StepCompleted, s.Status == engine.StepFailed, s.Status == engine.StepRetrying, s.Status == engine.StepWaiting:
		return string(s.Status)
	}
	return "interrupted"
}

// runHere runs a step that acts on nothing outside the process, on the
// drive's goroutine: a wait, a gate's verdict, a pure step, a delivery an
// earlier drive claimed.
func (d *drive) runHere(p engine.StepPlan) error {
	return d.spanned(p, func() error {
		switch {
		case p.Wait != nil:
			return d.runWait(p)
		case p.Gate != nil:
			return d.runGate(p)
		case p.Pure:
			d.runPure(p)
			return nil
		default:
			res, err := d.claimedDelivery(p)
			return d.journalOutcome(p, res, err, 0)
		}
	})
}

// runPure journals a step that needs no I/O: its output (or, for a pure
// step that fails, its error).
func (d *drive) runPure(p engine.StepPlan) {
	if !d.prepare(p) {
		return
	}
	if p.Error != "" {
		d.emit(event.StepFailed, p.StepID, p.Attempt, event.StepFailedData{Error: p.Error, Class: p.Class})
		return
	}
	if err := d.fits(p, "output", p.Output); err != nil {
		d.emit(event.StepFailed, p.StepID, p.Attempt, event.StepFailedData{Error: err.Error(), Class: baseClass(p.NodeType)})
		return
	}
	d.emit(event.StepCompleted, p.StepID, p.Attempt, event.StepCompletedData{Output: p.Output,
		SignalSeq: p.SignalSeq, CopiedFrom: p.CopiedFrom})
}

// prepare emits the step_started of a step not started yet; a step whose
// input cannot be journaled fails instead (false).
func (d *drive) prepare(p engine.StepPlan) bool {
	if p.Started {
		return true
	}
	if err := d.fits(p, "input", p.Input); err != nil {
		d.emit(event.StepFailed, p.StepID, p.Attempt, event.StepFailedData{Error: err.Error(), Class: baseClass(p.NodeType)})
		return false
	}
	d.emit(event.StepStarted, p.StepID, p.Attempt, event.StepStartedData{
		NodeID: p.NodeID, NodeType: p.NodeType, Input: p.Input, IdempotencyKey: p.Key})
	return true
}

// runAlone runs a process step on the drive's goroutine with nothing else
// in flight: its child reports sub-steps, which the drive journals while
// the process runs (process.go).
func (d *drive) runAlone(p engine.StepPlan) error {
	return d.spanned(p, func() error {
		if !d.prepare(p) {
			return nil
		}
		// Barrier: step_started is durable before the step acts.
		if err := d.flush(); err != nil {
			return err
		}
		start := time.Now()
		res, err := d.execProcess(p)
		if c := context.Cause(d.ctx); c != nil {
			// Interrupted (lease lost, shutdown): journal nothing more.
			return c
		}
		if errors.Is(err, errReport) {
			return err // the drive cannot journal: the next drive resumes the step
		}
		return d.journalOutcome(p, res, err, time.Since(start))
	})
}

// journalOutcome journals a step's outcome: completed, retrying or failed.
func (d *drive) journalOutcome(p engine.StepPlan, res stepResult, err error, took time.Duration) error {
	dur := took.Milliseconds()
	if res.delivered != nil {
		d.emit(event.SideEffectDelivered, p.StepID, p.Attempt, *res.delivered)
	}
	if err == nil {
		if ferr := d.fits(p, "output", res.output); ferr != nil {
			err = ferr // journaling it would fail on every try: the step fails
		}
	}
	if err == nil && res.confidence != nil {
		// Scored once: the verdict is the engine's, from the journal.
		d.emit(event.ConfidenceEvaluated, p.StepID, p.Attempt, *res.confidence)
		return d.flush()
	}
	if err == nil {
		if p.GateOff && res.final {
			d.emit(event.ConfidenceGateBypassed, p.StepID, p.Attempt, event.ConfidenceGateBypassedData{
				By: event.BypassedByPolicy, Reason: "the workflow's policy.confidenceGate is off"})
		}
		d.emit(event.StepCompleted, p.StepID, p.Attempt, event.StepCompletedData{
			Output: res.output, Usage: res.usage, DurationMs: dur, Delivery: res.delivery, Stderr: res.stderr})
		return nil
	}
	f := classify(p.NodeType, err)
	retry, attempt, of := engine.RetryDecision(p, f.classes, f.retryable, f.sameKey())
	msg := redact.String(err.Error()) // what is journaled and logged keeps no URL's secrets
	if next, ok := engine.NextModel(p, retry, f.outage(d.w.cfg.RetryAfterMax)); ok && f.fallback {
		// The next model of the list, at once: a new attempt, a new key.
		d.log.Info("step failed; moving to the next model", "step_id", p.StepID, "attempt", p.Attempt+1, "fallback", next, "err", msg)
		d.emit(event.StepRetrying, p.StepID, p.Attempt, event.StepRetryingData{
			Attempt: p.Attempt + 1, Of: of, Error: msg, Class: f.classes[0], Fallback: next, Usage: res.usage})
		return d.flush()
	}
	if retry {
		delay, asked := retryWait(p.Node.Retry(), p.Tries+1, f, d.w.cfg.RetryAfterMax)
		d.log.Info("step failed; retrying", "step_id", p.StepID, "attempt", attempt, "of", of, "err", msg, "delay", delay)
		d.emit(event.StepRetrying, p.StepID, p.Attempt, event.StepRetryingData{
			Attempt: attempt, Of: of, Error: msg, Class: f.classes[0], DelayMs: delay.Milliseconds(),
			RetryAfterMs: asked.Milliseconds(), Fallback: p.Fallback, Usage: res.usage})
		return d.flush()
	}
	d.log.Info("step failed", "step_id", p.StepID, "attempt", p.Attempt, "err", msg)
	d.emit(event.StepFailed, p.StepID, p.Attempt, event.StepFailedData{
		Error: msg, Class: f.classes[0], DurationMs: dur, OutcomeUnknown: f.unknown, Stderr: res.stderr, Usage: res.usage})
	return nil
}

// inputArrived reports whether what a wait plan waits for is in the
// state now: a decision on the approval, a signal of the wait's name.
func (d *drive) inputArrived(p engine.StepPlan) bool {
	if p.Wait.Signal != "" {
		return d.st.PendingSignal(p.Wait.Signal) != nil
	}
	_, ok := d.st.Decisions[p.StepID]
	return ok
}

// runWait journals a waiting step (an approval, a wait) with the deadline Next
// gave it, or parks the run on a journaled wait. A wait with a deadline
// schedules a durable wake-up before it is journaled. A wait that timed
// out is not a wait: Next plans its timed-out completion instead.
func (d *drive) runWait(p engine.StepPlan) error {
	if !p.Started {
		d.emit(event.StepStarted, p.StepID, p.Attempt, event.StepStartedData{
			NodeID: p.NodeID, NodeType: p.NodeType, Input: p.Input, IdempotencyKey: p.Key})
	}
	if p.Wait.Waiting {
		if err := d.flush(); err != nil {
			return err
		}
		return errParked
	}
	// Flush what came before: a conflict with a decision that already
	// arrived folds it in, and the step need not wait at all.
	if err := d.flush(); err != nil {
		return err
	}
	if d.inputArrived(p) {
		return nil
	}
	data := event.StepWaitingData{Reason: p.Wait.Reason}
	if at := p.Wait.TimeoutAt; !at.IsZero() {
		data.TimeoutAt = at.UTC().Format(time.RFC3339Nano)
		// A wake-up that fires for a run that never parked is harmless;
		// a parked run without one would wait forever.
		if err := d.w.store.ScheduleWake(d.ctx, d.runID, d.st.LastSeq+1, at.Add(time.Second)); err != nil {
			return err
		}
	}
	d.emit(event.StepWaiting, p.StepID, p.Attempt, data)
	return d.flush() // Next decides: park, or a decision already came
}

// fits checks that a step's input or output can be journaled: an event
// whose JSON comes near the stream's limit cannot be appended, and a drive
// that kept trying would run the step again and again.
func (d *drive) fits(p engine.StepPlan, what string, v json.RawMessage) error {
	// A value above the blob threshold is kept in PAL_BLOBS (§6.4), so
	// the bound is a blob's, not the journal's message size.
	limit := d.w.store.MaxValueBytes()
	if len(v) <= limit {
		return nil
	}
	return permanent("step %s: its %s is %d bytes; a step value is at most %d bytes (event.MaxBlobBytes)",
		p.StepID, what, len(v), limit)
}

func timeoutOf(ms int, def time.Duration) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return def
}
