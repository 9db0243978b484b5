package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/palrun/pal/connector"
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
	// stderr is a process step's stderr tail, journaled with its outcome.
	stderr string
	// confidence is the score of a gated LLM step's answer: journaled
	// before anything else, its verdict is then planned like a replay's.
	confidence *event.ConfidenceEvaluatedData
	// final: an LLM answer with no tool calls (an agent's last turn).
	final bool
}

// runStep executes one planned step attempt and journals its outcome,
// under the attempt's span; the span's end counts the attempt
// (pal_steps_total by node type and outcome).
func (d *drive) runStep(p engine.StepPlan) error {
	outer := d.ctx
	ctx, span := telemetry.StartStep(d.ctx, d.runID, p.StepID, p.Attempt, p.NodeType)
	d.ctx = ctx
	err := d.step(p)
	d.ctx = outer
	span.End(d.stepOutcome(p, err))
	return err
}

// stepOutcome names how a step attempt ended: as the state has it after
// the attempt, or waiting (parked), or interrupted (the drive ended first).
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
	switch s.Status {
	case engine.StepCompleted, engine.StepFailed, engine.StepRetrying, engine.StepWaiting:
		return string(s.Status)
	}
	return "interrupted"
}

// step is runStep's work.
func (d *drive) step(p engine.StepPlan) error {
	if wait := p.NotBefore.Sub(d.w.now()); wait > 0 {
		// A retry's backoff; flush first so nothing waits in memory.
		if err := d.flush(); err != nil {
			return err
		}
		sleep(d.ctx, wait)
		if d.ctx.Err() != nil {
			return context.Cause(d.ctx)
		}
	}
	if p.Wait != nil {
		return d.runWait(p)
	}
	if p.Gate != nil {
		return d.runGate(p)
	}
	if p.Exec == engine.ExecSubagent {
		return d.runSubagent(p)
	}
	if !p.Started {
		if err := d.fits(p, "input", p.Input); err != nil {
			// The step cannot even be journaled as started: it fails.
			d.emit(event.StepFailed, p.StepID, p.Attempt, event.StepFailedData{Error: err.Error(), Class: baseClass(p.NodeType)})
			return nil
		}
		d.emit(event.StepStarted, p.StepID, p.Attempt, event.StepStartedData{
			NodeID: p.NodeID, NodeType: p.NodeType, Input: p.Input, IdempotencyKey: p.Key})
	}
	if p.Pure {
		if err := d.fits(p, "output", p.Output); err != nil {
			d.emit(event.StepFailed, p.StepID, p.Attempt, event.StepFailedData{Error: err.Error(), Class: baseClass(p.NodeType)})
			return nil
		}
		d.emit(event.StepCompleted, p.StepID, p.Attempt, event.StepCompletedData{Output: p.Output,
			SignalSeq: p.SignalSeq, CopiedFrom: p.CopiedFrom})
		return nil
	}
	// Barrier: step_started is durable before the step acts.
	if err := d.flush(); err != nil {
		return err
	}
	start := time.Now()
	res, err := d.execute(p)
	if c := context.Cause(d.ctx); c != nil {
		// Interrupted (lease lost, shutdown): journal nothing more.
		return c
	}
	if errors.Is(err, errReport) {
		return err // the drive cannot journal: the next drive resumes the step
	}
	return d.journalOutcome(p, res, err, time.Since(start))
}

// journalOutcome journals a step's outcome: completed, retrying or failed.
func (d *drive) journalOutcome(p engine.StepPlan, res stepResult, err error, took time.Duration) error {
	dur := took.Milliseconds()
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

// journalFailure journals a step that failed after spending usage (a
// subagent whose child run failed): step_failed carries the spend.
func (d *drive) journalFailure(p engine.StepPlan, usage *event.Usage, err error, took time.Duration) error {
	return d.journalOutcome(p, stepResult{usage: usage}, err, took)
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

func (d *drive) execute(p engine.StepPlan) (stepResult, error) {
	switch p.Exec {
	case engine.ExecLLM:
		return d.execAI(p)
	case engine.ExecTool:
		return d.execTool(p)
	case engine.ExecConnector:
		return d.execConnector(p)
	case engine.ExecProcess:
		return d.execProcess(p)
	default:
		return stepResult{}, permanent("step %s: nothing executes %q steps", p.StepID, p.Exec)
	}
}

func timeoutOf(ms int, def time.Duration) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return def
}

func (d *drive) execTool(p engine.StepPlan) (stepResult, error) {
	var in engine.ToolInput
	if err := json.Unmarshal(p.Input, &in); err != nil {
		return stepResult{}, permanent("step %s: bad input: %v", p.StepID, err)
	}
	fn, ok := d.w.tools[in.Tool]
	if !ok {
		names := make([]string, 0, len(d.w.tools))
		for n := range d.w.tools {
			names = append(names, n)
		}
		sort.Strings(names)
		return stepResult{}, permanent("step %s: tool %q is not registered on worker %s (registered: %v)", p.StepID, in.Tool, d.w.cfg.ID, names)
	}
	ctx, cancel := context.WithTimeout(d.ctx, timeoutOf(p.TimeoutMs, defaultToolTimeout))
	defer cancel()
	ctx = context.WithValue(ctx, stepInfoKey{}, StepInfo{RunID: d.runID, StepID: p.StepID, Attempt: p.Attempt, IdempotencyKey: p.Key})
	sec := d.w.secretsFor(p.Node)
	out, err := fn(context.WithValue(ctx, secretsKey{}, sec), in.Input)
	if err != nil {
		return stepResult{}, redact.Error(err, sec.used...)
	}
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	if !json.Valid(out) {
		return stepResult{}, &ToolError{Err: fmt.Errorf("tool %q returned output that is not JSON", in.Tool)}
	}
	return stepResult{output: out}, nil
}

// execConnector delivers once, with a receipt: claim (durable) → send →
// confirm. A claim without a confirmation from an earlier drive means the
// outcome is unknown; it is not sent again.
func (d *drive) execConnector(p engine.StepPlan) (stepResult, error) {
	var in engine.ConnectorInput
	if err := json.Unmarshal(p.Input, &in); err != nil {
		return stepResult{}, permanent("step %s: bad input: %v", p.StepID, err)
	}
	switch {
	case p.Delivered:
		return deliveryResult(event.DeliveryDelivered, d.st.Steps[p.StepID].DeliveryStatus)
	case p.Claimed:
		d.log.Warn("delivery was claimed by an interrupted drive and never confirmed; not sending again",
			"step_id", p.StepID, "attempt", p.Attempt, "idempotency_key", p.Key)
		return deliveryResult(event.DeliveryUnconfirmed, 0)
	}
	conn, err := d.w.connectors.Get(in.Kind)
	if err != nil {
		return stepResult{}, permanent("step %s: %v", p.StepID, err)
	}
	sec := d.w.secretsFor(p.Node)
	url, headers, err := sec.expandAll(in.URL, in.Headers)
	if err != nil {
		return stepResult{}, fmt.Errorf("step %s: %w", p.StepID, err)
	}
	target := redact.URL(in.URL)
	if in.Email != nil {
		target = emailTarget(in.Email)
	}
	d.emit(event.SideEffectClaimed, p.StepID, p.Attempt, event.SideEffectClaimedData{
		IdempotencyKey: p.Key, Connector: in.Kind, Target: target})
	if err := d.flush(); err != nil {
		return stepResult{}, err
	}
	// The delivery is claimed: let it finish even if the drive is being
	// stopped, so the receiver is not left with a cut request.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), timeoutOf(p.TimeoutMs, defaultConnectorTimeout))
	defer cancel()
	rec, err := conn.Deliver(ctx, connector.Delivery{RunID: d.runID, StepID: p.StepID, IdempotencyKey: p.Key,
		URL: url, Method: in.Method, Headers: headers, Body: in.Body, Email: in.Email})
	if err != nil {
		return stepResult{}, redact.Error(err, sec.used...)
	}
	d.emit(event.SideEffectDelivered, p.StepID, p.Attempt, event.SideEffectDeliveredData{
		IdempotencyKey: p.Key, Status: rec.Status})
	return deliveryResult(event.DeliveryDelivered, rec.Status)
}

func deliveryResult(delivery string, status int) (stepResult, error) {
	b, err := json.Marshal(engine.ConnectorOutput{Delivery: delivery, Status: status})
	if err != nil {
		return stepResult{}, err
	}
	return stepResult{output: b, delivery: delivery}, nil
}

// maxEmailTarget bounds the recipients quoted in side_effect_claimed.
const maxEmailTarget = 256

// emailTarget names an email's recipients for the claim, as a mailto: URL
// cut to maxEmailTarget bytes.
func emailTarget(m *connector.Email) string {
	t := "mailto:" + m.To
	if len(t) > maxEmailTarget {
		t = strings.ToValidUTF8(t[:maxEmailTarget], "") + "…"
	}
	return t
}
