package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// baseTS is the time of every history's run_created.
var baseTS = time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)

// history builds a run's journal the way a worker writes it: each step
// event follows what Frontier plans, so the histories are ones PAL could
// have written. Every event is folded as it is appended.
type history struct {
	t      testing.TB
	runID  string
	evs    []event.Event
	st     *engine.RunState
	now    time.Time
	worker string
	// busy are the steps in flight in the current drive: started by it,
	// their outcome not journaled yet.
	busy map[string]bool
}

// newHistory starts a run of the workflow wfJSON (which must parse) with
// input.
func newHistory(t testing.TB, runID, wfJSON, input string) *history {
	t.Helper()
	wf, err := workflow.Parse([]byte(wfJSON))
	require.NoError(t, err)
	return newHistoryRaw(t, runID, wf.Raw(), wf.Name, input)
}

// newForkHistory starts a run of wfJSON forked as ff says.
func newForkHistory(t testing.TB, runID, wfJSON, input string, ff *event.ForkedFrom) *history {
	t.Helper()
	wf, err := workflow.Parse([]byte(wfJSON))
	require.NoError(t, err)
	return newHistoryWith(t, runID, wf.Raw(), wf.Name, input, ff)
}

// newHistoryRaw starts a run whose run_created carries the snapshot raw as
// it is, whether or not it parses.
func newHistoryRaw(t testing.TB, runID string, raw json.RawMessage, name, input string) *history {
	t.Helper()
	return newHistoryWith(t, runID, raw, name, input, nil)
}

func newHistoryWith(t testing.TB, runID string, raw json.RawMessage, name, input string, ff *event.ForkedFrom) *history {
	t.Helper()
	h := &history{t: t, runID: runID, st: &engine.RunState{}, now: baseTS, worker: "pal", busy: map[string]bool{}}
	d := event.RunCreatedData{Depth: 0, TriggerMeta: map[string]any{"source": "api"}, ForkedFrom: ff}
	if input != "" {
		d.Input = json.RawMessage(input)
	}
	if raw != nil {
		sum := sha256.Sum256(raw)
		d.Workflow, d.WorkflowHash, d.WorkflowName = raw, hex.EncodeToString(sum[:]), name
	}
	h.append(event.RunCreated, "", 0, d)
	return h
}

// append stamps, folds and records one event; the clock moves 25 ms.
func (h *history) append(k event.Kind, stepID string, attempt int, payload any) event.Event {
	h.t.Helper()
	ev := event.MustNew(k, stepID, attempt, payload)
	ev.RunID = h.runID
	ev.Seq = uint64(len(h.evs)) + 1
	ev.TS = h.now
	ev.WorkerID = h.worker
	require.NoError(h.t, h.st.Apply(ev), "folding %s at seq %d", k, ev.Seq)
	trackBusy(h.busy, ev)
	h.evs = append(h.evs, ev)
	h.now = h.now.Add(25 * time.Millisecond)
	return ev
}

// wait moves the clock.
func (h *history) wait(d time.Duration) *history {
	h.now = h.now.Add(d)
	return h
}

// resume appends run_resumed for a new drive by worker, as a worker does:
// the previous drive crashed if it was still open.
func (h *history) resume(worker string) *history {
	h.t.Helper()
	h.worker = worker
	crashed := h.st.DriveOpen
	crashes := 0
	if crashed {
		crashes = h.st.CrashesAtStep + 1
	}
	h.append(event.RunResumed, "", 0, event.RunResumedData{Worker: worker,
		ResumeCount: h.st.Resumes + 1, Crashed: crashed, CrashesAtStep: crashes})
	return h
}

// trackBusy keeps busy, the steps in flight in the current drive, up to
// date with ev: a drive starts with none in flight.
func trackBusy(busy map[string]bool, ev event.Event) {
	switch ev.Kind {
	case event.RunResumed:
		clear(busy)
	case event.StepStarted:
		busy[ev.StepID] = true
	case event.StepCompleted, event.StepFailed, event.StepRetrying, event.StepWaiting:
		delete(busy, ev.StepID)
	}
}

// plan returns the plan of stepID in what Frontier plans now, with the
// steps in flight in the current drive but stepID busy; it must be there.
func (h *history) plan(stepID string) engine.StepPlan {
	h.t.Helper()
	p, a := planIn(h.st, h.busy, stepID, h.now)
	require.NotNil(h.t, p, "want step %s next, Frontier says %#v", stepID, a)
	return *p
}

// planIn finds stepID's plan in Frontier's answer with busy but stepID
// in flight; nil (and the answer) when it is not there.
func planIn(st *engine.RunState, busy map[string]bool, stepID string, now time.Time) (*engine.StepPlan, engine.Action) {
	others := maps.Clone(busy)
	delete(others, stepID)
	a := engine.Frontier(context.Background(), st.Workflow, st, now, others)
	if rs, ok := a.(engine.RunSteps); ok {
		for i := range rs.Plans {
			if rs.Plans[i].StepID == stepID {
				return &rs.Plans[i], a
			}
		}
	}
	return nil, a
}

// ready lists the step ids Frontier plans now, with the steps in flight
// in the current drive busy.
func (h *history) ready() []string {
	h.t.Helper()
	a := engine.Frontier(context.Background(), h.st.Workflow, h.st, h.now, h.busy)
	rs, ok := a.(engine.RunSteps)
	require.True(h.t, ok, "Frontier says %#v", a)
	ids := []string{}
	for _, p := range rs.Plans {
		ids = append(ids, p.StepID)
	}
	return ids
}

// interrupt journals step_failed class interrupted for a step in flight
// when the step by failed the run, as the drive does once its call has
// returned cancelled.
func (h *history) interrupt(stepID, by string) *history {
	h.t.Helper()
	require.True(h.t, h.busy[stepID], "step %s is not in flight", stepID)
	_, ok := engine.Frontier(context.Background(), h.st.Workflow, h.st, h.now, h.busy).(engine.Fail)
	require.True(h.t, ok, "the run is not failing")
	h.append(event.StepFailed, stepID, h.st.Steps[stepID].Attempt, event.StepFailedData{
		Error: "interrupted: step " + by + " failed the run", Class: event.ClassInterrupted,
		DurationMs: 50, OutcomeUnknown: true, InterruptedBy: by})
	return h
}

// start journals step_started for the step Next plans (unless the plan
// resumes an attempt that already started).
func (h *history) start(stepID string) *history {
	h.t.Helper()
	p := h.plan(stepID)
	if p.NotBefore.After(h.now) {
		h.now = p.NotBefore
	}
	if !p.Started {
		h.append(event.StepStarted, p.StepID, p.Attempt, event.StepStartedData{
			NodeID: p.NodeID, NodeType: p.NodeType, Input: p.Input, IdempotencyKey: p.Key})
	}
	return h
}

// complete journals step_completed of the running step.
func (h *history) complete(stepID, output string, usage *event.Usage) *history {
	h.t.Helper()
	return h.completeWith(stepID, event.StepCompletedData{Output: json.RawMessage(output), Usage: usage})
}

func (h *history) completeWith(stepID string, d event.StepCompletedData) *history {
	h.t.Helper()
	p := h.plan(stepID)
	require.True(h.t, p.Started, "step %s completes before it started", stepID)
	d.DurationMs = 400
	h.wait(400 * time.Millisecond)
	h.append(event.StepCompleted, stepID, p.Attempt, d)
	return h
}

// llm journals an ai-step's start and completion, with the output shape
// the worker writes.
func (h *history) llm(stepID, text, model string, in, out int64) *history {
	h.t.Helper()
	return h.start(stepID).llmEnd(stepID, text, model, in, out)
}

// llmEnd journals the completion of a started ai-step.
func (h *history) llmEnd(stepID, text, model string, in, out int64) *history {
	h.t.Helper()
	o, err := json.Marshal(map[string]any{"text": text, "model": model, "finish_reason": "stop", "id": "resp_" + stepID})
	require.NoError(h.t, err)
	cost := math.Round((float64(in)*0.15+float64(out)*0.6)*1e3) / 1e9 // gpt-4o-mini prices, rounded
	return h.complete(stepID, string(o), &event.Usage{InputTokens: in, OutputTokens: out, TotalTokens: in + out, CostUSD: cost})
}

// pure journals a condition node: step_started and step_completed with the
// output Next computed, as the worker does.
func (h *history) pure(stepID string) *history {
	h.t.Helper()
	p := h.plan(stepID)
	require.True(h.t, p.Pure, "step %s is not pure", stepID)
	if !p.Started {
		h.append(event.StepStarted, p.StepID, p.Attempt, event.StepStartedData{
			NodeID: p.NodeID, NodeType: p.NodeType, Input: p.Input, IdempotencyKey: p.Key})
	}
	h.append(event.StepCompleted, p.StepID, p.Attempt, event.StepCompletedData{Output: p.Output,
		SignalSeq: p.SignalSeq, CopiedFrom: p.CopiedFrom})
	return h
}

// signal journals a signal_received sent by who, as runs.Client.Signal
// does.
func (h *history) signal(name, payload, who string) *history {
	h.t.Helper()
	worker := h.worker
	h.worker = who
	h.append(event.SignalReceived, "", 0, event.SignalReceivedData{Signal: name, Payload: json.RawMessage(payload), By: who})
	h.worker = worker
	return h
}

// waitFor journals an approval's wait as the worker does: step_started,
// then step_waiting with the deadline Next gave it.
func (h *history) waitFor(stepID string) *history {
	h.t.Helper()
	p := h.plan(stepID)
	require.NotNil(h.t, p.Wait, "step %s does not wait", stepID)
	require.False(h.t, p.Wait.Waiting, "step %s waits already", stepID)
	if !p.Started {
		h.append(event.StepStarted, p.StepID, p.Attempt, event.StepStartedData{
			NodeID: p.NodeID, NodeType: p.NodeType, Input: p.Input, IdempotencyKey: p.Key})
	}
	d := event.StepWaitingData{Reason: p.Wait.Reason}
	if !p.Wait.TimeoutAt.IsZero() {
		d.TimeoutAt = p.Wait.TimeoutAt.Format(time.RFC3339Nano)
	}
	h.append(event.StepWaiting, p.StepID, p.Attempt, d)
	return h
}

// failTry journals a failed try of the running step: step_retrying when
// the policy allows another try, else step_failed. It reports which.
func (h *history) failTry(stepID, msg, class string, retryable, unknown bool, delay time.Duration) bool {
	h.t.Helper()
	p := h.plan(stepID)
	require.True(h.t, p.Started, "step %s fails before it started", stepID)
	h.wait(300 * time.Millisecond)
	retry, attempt, of := engine.RetryDecision(p, []string{class}, retryable, unknown)
	if retry {
		h.append(event.StepRetrying, stepID, p.Attempt, event.StepRetryingData{
			Attempt: attempt, Of: of, Error: msg, Class: class, DelayMs: delay.Milliseconds()})
		return true
	}
	h.append(event.StepFailed, stepID, p.Attempt, event.StepFailedData{Error: msg, Class: class, DurationMs: 300})
	return false
}

// claim journals side_effect_claimed for the running connector step.
func (h *history) claim(stepID string) *history {
	h.t.Helper()
	p := h.plan(stepID)
	var in engine.ConnectorInput
	require.NoError(h.t, json.Unmarshal(p.Input, &in))
	h.append(event.SideEffectClaimed, stepID, p.Attempt, event.SideEffectClaimedData{
		IdempotencyKey: p.Key, Connector: in.Kind, Target: in.URL})
	return h
}

// deliver journals side_effect_delivered for the claimed delivery.
func (h *history) deliver(stepID string, status int) *history {
	h.t.Helper()
	p := h.plan(stepID)
	require.True(h.t, p.Claimed, "delivery of %s not claimed", stepID)
	h.wait(120 * time.Millisecond)
	h.append(event.SideEffectDelivered, stepID, p.Attempt, event.SideEffectDeliveredData{IdempotencyKey: p.Key, Status: status})
	return h
}

// deliveryDone completes a connector step as the worker does.
func (h *history) deliveryDone(stepID string) *history {
	h.t.Helper()
	p := h.plan(stepID)
	out := map[string]any{"delivery": event.DeliveryUnconfirmed}
	delivery := event.DeliveryUnconfirmed
	if p.Delivered {
		delivery = event.DeliveryDelivered
		out = map[string]any{"delivery": delivery, "status": h.st.Steps[stepID].DeliveryStatus}
	}
	b, err := json.Marshal(out)
	require.NoError(h.t, err)
	return h.completeWith(stepID, event.StepCompletedData{Output: b, Delivery: delivery})
}

// finish ends the run the way Next says: run_succeeded or run_failed.
func (h *history) finish() *history {
	h.t.Helper()
	switch a := engine.Next(h.st.Workflow, h.st, h.now).(type) {
	case engine.Complete:
		h.append(event.RunSucceeded, "", 0, event.RunSucceededData{Output: a.Output})
	case engine.Fail:
		h.append(event.RunFailed, "", 0, event.RunFailedData{Error: a.Error, Code: a.Code, StepID: a.StepID})
	default:
		require.Failf(h.t, "run cannot finish", "Next says %#v", a)
	}
	return h
}

// events returns the journal so far.
func (h *history) events() []event.Event { return h.evs }
