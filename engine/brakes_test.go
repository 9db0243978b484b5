package engine_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// Run ids of the brakes' scenarios.
const (
	runBudgetSteps  = "run_01JNB6W2G8Z4K0S1C5V7X9D3B0"
	runBudgetPause  = "run_01JNB6W2G8Z4K0S1C5V7X9D3B1"
	runRunaway      = "run_01JNB6W2G8Z4K0S1C5V7X9D3B2"
	runExcessive    = "run_01JNB6W2G8Z4K0S1C5V7X9D3B3"
	runRetryStorm   = "run_01JNB6W2G8Z4K0S1C5V7X9D3B4"
	runSpikes       = "run_01JNB6W2G8Z4K0S1C5V7X9D3B5"
	runSpikesPaused = "run_01JNB6W2G8Z4K0S1C5V7X9D3B6"
	runPrices       = "run_01JNB6W2G8Z4K0S1C5V7X9D3B7"
)

func brakeScenarios() []scenario {
	return []scenario{
		{name: "budget_steps_exceeded", build: buildBudgetSteps},
		{name: "budget_paused_raised", build: buildBudgetPause},
		{name: "anomaly_runaway_loop", build: buildRunaway},
		{name: "anomaly_excessive_steps", build: buildExcessive},
		{name: "anomaly_retry_storm", build: buildRetryStorm},
		{name: "anomaly_spikes_paused", build: buildSpikesPaused},
		{name: "anomaly_spikes_approved", build: buildSpikes},
		{name: "budget_journaled_prices", build: buildBudgetJournaledPrices},
	}
}

// withPolicy returns wfJSON (an object) with a policy member added.
func withPolicy(t testing.TB, wfJSON, policy string) string {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(wfJSON), &m))
	m["policy"] = json.RawMessage(policy)
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return string(b)
}

// newStarted starts a run as runs.Client.Start did before run_created
// journaled prices: the brakes' first histories, which the legacy prices
// price.
func newStarted(t testing.TB, runID, wfJSON, input string, req *event.Budget) *history {
	t.Helper()
	return newStartedPriced(t, runID, wfJSON, input, req, nil)
}

// newStartedPriced starts a run as runs.Client.Start does
// (engine.RunCreated): run_created carries the effective budget (narrowed
// by req), anomaly rules and, unless table is nil, the prices of the
// workflow's models in table, the creating process's.
func newStartedPriced(t testing.TB, runID, wfJSON, input string, req *event.Budget, table event.Prices) *history {
	t.Helper()
	wf, err := workflow.Parse([]byte(wfJSON))
	require.NoError(t, err)
	ev, err := engine.RunCreated(engine.Creation{Workflow: wf, Input: json.RawMessage(input), Budget: req,
		Prices: table, TriggerMeta: map[string]any{"source": "api"}, By: "pal"})
	require.NoError(t, err)
	var d event.RunCreatedData
	require.NoError(t, ev.DecodeData(&d))
	if table == nil {
		d.Prices = nil
	}
	h := &history{t: t, runID: runID, st: &engine.RunState{}, now: baseTS, worker: ev.WorkerID, busy: map[string]bool{}}
	h.append(event.RunCreated, "", 0, d)
	return h
}

// brake journals what Next says, which must be a brake: a note, or a new
// park.
func (h *history) brake(kind event.Kind) *history {
	h.t.Helper()
	switch a := engine.Next(h.st.Workflow, h.st, h.now).(type) {
	case engine.Note:
		require.Equal(h.t, kind, a.Kind)
		h.append(a.Kind, a.StepID, 0, a.Data)
	case engine.Park:
		require.Equal(h.t, kind, event.StepWaiting)
		require.False(h.t, a.Waiting)
		h.append(event.StepWaiting, a.StepID, 0, event.StepWaitingData{Reason: a.Reason})
	default:
		require.Failf(h.t, "no brake", "want %s, Next says %#v", kind, a)
	}
	return h
}

// turn journals an agent turn that asks for the tool calls, or answers.
func (h *history) turn(stepID string, calls ...provider2) *history {
	h.t.Helper()
	h.start(stepID)
	out := map[string]any{"text": "", "model": "gpt-4o-mini", "finish_reason": "tool_calls", "id": "resp_" + stepID}
	if len(calls) == 0 {
		out["text"], out["finish_reason"] = "done", "stop"
	}
	var tc []map[string]any
	for i, c := range calls {
		tc = append(tc, map[string]any{"id": fmt.Sprintf("call_%d", i), "name": c.name, "arguments": json.RawMessage(c.args)})
	}
	if tc != nil {
		out["tool_calls"] = tc
	}
	b, err := json.Marshal(out)
	require.NoError(h.t, err)
	return h.complete(stepID, string(b), &event.Usage{InputTokens: 50, OutputTokens: 10, TotalTokens: 60, CostUSD: 0.0000135})
}

type provider2 struct{ name, args string }

func buildBudgetSteps(t testing.TB) []event.Event {
	wf := withPolicy(t, wfSummarise, `{"budget":{"maxSteps":5,"warnAt":0.5}}`)
	// The request narrows maxSteps to 2: publish, the third, is never sent.
	h := newStarted(t, runBudgetSteps, wf, inputSummarise, &event.Budget{MaxSteps: 2}).resume("worker-a")
	h.llm("draft", "PAL journals each agent step.", "gpt-4o-mini-2024-07-18", 58, 14)
	h.brake(event.BudgetWarning) // one of two steps spent: warnAt 0.5
	h.llm("review", "Accurate.", "claude-sonnet-4-5-20250929", 41, 6)
	h.brake(event.BudgetExceeded)
	return h.finish().events()
}

func buildBudgetPause(t testing.TB) []event.Event {
	// draft's worst case (gpt-4o-mini, 4096 output tokens) fits in $0.003;
	// review (claude-sonnet-4-5) would have room for some 190 output
	// tokens, less than engine.MinOutputRoom: the run pauses until the
	// budget is raised, then goes on.
	wf := withPolicy(t, wfSummarise, `{"budget":{"maxCostUsd":0.003,"onExceed":"pause"}}`)
	h := newStarted(t, runBudgetPause, wf, inputSummarise, nil).resume("worker-a")
	h.llm("draft", "PAL journals each agent step.", "gpt-4o-mini-2024-07-18", 58, 14)
	h.brake(event.BudgetExceeded).brake(event.StepWaiting)
	h.wait(time.Minute)
	h.worker = "ana"
	h.append(event.BudgetRaised, "", 0, event.BudgetRaisedData{AddUSD: 0.1, By: "ana"})
	h.resume("worker-b")
	h.llm("review", "Accurate.", "claude-sonnet-4-5-20250929", 41, 6)
	h.llm("publish", "Agent runs that survive crashes", "gpt-4o-mini-2024-07-18", 37, 7)
	return h.finish().events()
}

const wfAgent = `{"name":"research","nodes":[{"id":"start","type":"trigger"},
	{"id":"ask","type":"agent","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"Find {{input.q}}",
	 "tools":[{"name":"lookup","description":"look it up","parameters":{"type":"object"}}],"maxTurns":10}}],
	"edges":[{"from":"start","to":"ask"}],
	"policy":{"anomalies":{"runaway_loop":{"threshold":3,"action":"halt"}}}}`

func buildRunaway(t testing.TB) []event.Event {
	h := newStarted(t, runRunaway, wfAgent, `{"q":"pal"}`, nil).resume("worker-a")
	same := provider2{"lookup", `{"q": "pal"}`}
	h.turn("ask.turn[0]", same).start("ask.turn[0].tool[0]").complete("ask.turn[0].tool[0]", `{"hits":0}`, nil)
	// The model spaces its arguments differently; they are the same.
	h.turn("ask.turn[1]", provider2{"lookup", `{"q":"pal"}`}).start("ask.turn[1].tool[0]").complete("ask.turn[1].tool[0]", `{"hits":0}`, nil)
	// The third identical request: halted before the tool runs again.
	h.turn("ask.turn[2]", same)
	h.brake(event.AnomalyDetected)
	return h.finish().events()
}

func buildExcessive(t testing.TB) []event.Event {
	wf := withPolicy(t, wfSummarise, `{"anomalies":{"excessive_steps":{"threshold":2}}}`)
	h := newStarted(t, runExcessive, wf, inputSummarise, nil).resume("worker-a")
	h.llm("draft", "PAL journals each agent step.", "gpt-4o-mini-2024-07-18", 58, 14)
	h.llm("review", "Accurate.", "claude-sonnet-4-5-20250929", 41, 6)
	h.brake(event.AnomalyDetected) // recorded: the run goes on
	h.llm("publish", "Agent runs that survive crashes", "gpt-4o-mini-2024-07-18", 37, 7)
	return h.finish().events()
}

func buildRetryStorm(t testing.TB) []event.Event {
	wf := withPolicy(t, wfSummarise, `{"anomalies":{"retry_storm":{"perStep":1,"action":"halt"}}}`)
	h := newStarted(t, runRetryStorm, wf, inputSummarise, nil).resume("worker-a")
	h.start("draft")
	require.True(t, h.failTry("draft", "openai: 503 Service Unavailable", event.ClassLLM, true, false, 500*time.Millisecond))
	h.start("draft")
	require.True(t, h.failTry("draft", "openai: 503 Service Unavailable", event.ClassLLM, true, false, time.Second))
	h.brake(event.AnomalyDetected) // the second retry of one step: halted before the third try
	return h.finish().events()
}

const wfFour = `{"name":"four","nodes":[{"id":"start","type":"trigger"},
	{"id":"a","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"a"}},
	{"id":"b","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"b {{steps.a.output.text}}"}},
	{"id":"c","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"c {{steps.b.output.text}}"}},
	{"id":"d","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"d {{steps.c.output.text}}"}}],
	"edges":[{"from":"start","to":"a"},{"from":"a","to":"b"},{"from":"b","to":"c"},{"from":"c","to":"d"}],
	"policy":{"anomalies":{"cost_spike":{"threshold":5,"floor":0.0001,"action":"pause"},"token_spike":{"threshold":5,"floor":1000}}}}`

func spikes(t testing.TB, runID string) *history {
	h := newStarted(t, runID, wfFour, `{}`, nil).resume("worker-a")
	h.llm("a", "a", "gpt-4o-mini", 80, 20).llm("b", "b", "gpt-4o-mini", 90, 20).llm("c", "c", "gpt-4o-mini", 70, 30)
	h.llm("d", "d", "gpt-4o-mini", 9000, 1000) // 100× the median
	return h.brake(event.AnomalyDetected).brake(event.AnomalyDetected).brake(event.StepWaiting)
}

func buildSpikesPaused(t testing.TB) []event.Event { return spikes(t, runSpikesPaused).events() }

func buildSpikes(t testing.TB) []event.Event {
	h := spikes(t, runSpikes)
	h.worker = "ana"
	h.append(event.ApprovalReceived, "d", 0, event.ApprovalReceivedData{Decision: event.DecisionApprove, Approver: "ana"})
	return h.resume("worker-b").finish().events()
}

func TestNarrowBudget(t *testing.T) {
	t.Parallel()
	base := &event.Budget{MaxCostUSD: 1, MaxSteps: 10, OnExceed: event.OnExceedFail}
	got, err := engine.NarrowBudget(base, &event.Budget{MaxCostUSD: 0.5, MaxTokens: 100})
	require.NoError(t, err)
	require.Equal(t, &event.Budget{MaxCostUSD: 0.5, MaxTokens: 100, MaxSteps: 10, OnExceed: event.OnExceedFail}, got)

	_, err = engine.NarrowBudget(base, &event.Budget{MaxCostUSD: 2})
	var we *engine.WideningError
	require.True(t, errors.As(err, &we))
	require.EqualError(t, err, "budget.maxCostUsd: 2 widens the workflow's limit of 1; a start request may only narrow the budget")
	_, err = engine.NarrowBudget(base, &event.Budget{OnExceed: event.OnExceedPause})
	require.ErrorAs(t, err, &we)
	got, err = engine.NarrowBudget(nil, &event.Budget{MaxSteps: 3})
	require.NoError(t, err)
	require.Equal(t, int64(3), got.MaxSteps)
}

func TestChildBudgetDrawsFromParent(t *testing.T) {
	t.Parallel()
	wf := withPolicy(t, wfSummarise, `{"budget":{"maxCostUsd":0.01,"maxSteps":3}}`)
	h := newStarted(t, testRun, wf, inputSummarise, nil).resume("worker-a")
	h.llm("draft", "x", "gpt-4o-mini", 58, 14)
	child, err := workflow.Parse([]byte(withPolicy(t, wfSummarise, `{"budget":{"maxCostUsd":5}}`)))
	require.NoError(t, err)
	b := engine.ChildBudget(h.st, child, h.now)
	require.InDelta(t, 0.01-h.st.Usage.CostUSD, b.MaxCostUSD, 1e-12)
	require.Equal(t, int64(2), b.MaxSteps)
}

// A run replayed from its journal decides the same: each anomaly is
// journaled once, however often Next is asked.
func TestAnomalyJournaledOnce(t *testing.T) {
	t.Parallel()
	evs := buildRunaway(t)
	st, err := engine.Fold(evs[:len(evs)-1]) // before run_failed
	require.NoError(t, err)
	require.Empty(t, st.PendingAnomalies())
	require.Len(t, st.AnomalyList(), 1)
	for range 3 {
		f, ok := engine.Next(st.Workflow, st, st.UpdatedAt).(engine.Fail)
		require.True(t, ok)
		require.Equal(t, event.CodeAnomaly, f.Code)
	}
}

func TestAnomalyPauseRejectedFailsTheRun(t *testing.T) {
	t.Parallel()
	h := spikes(t, testRun)
	h.append(event.ApprovalReceived, "d", 0, event.ApprovalReceivedData{Decision: event.DecisionReject, Approver: "bo", Comment: "too dear"})
	f, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.Fail)
	require.True(t, ok)
	require.Equal(t, event.CodeAnomaly, f.Code)
	require.Equal(t, "d", f.StepID)
	require.Contains(t, f.Error, "cost_spike")
	require.Contains(t, f.Error, "bo rejected going on: too dear")
}

func TestIdenticalRequestsAreARunawayLoop(t *testing.T) {
	t.Parallel()
	// A loop whose body sends the same prompt every iteration.
	wf := `{"name":"again","nodes":[{"id":"start","type":"trigger"},
		{"id":"each","type":"loop","data":{"over":"{{input.xs}}","body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
			{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"same"}}],
			"edges":[{"from":"start","to":"ask"}]}}}],"edges":[{"from":"start","to":"each"}],
		"policy":{"anomalies":{"runaway_loop":{"requests":3}}}}`
	h := newStarted(t, testRun, wf, `{"xs":[1,2,3,4]}`, nil).resume("w")
	h.llm("each[0].ask", "x", "gpt-4o-mini", 10, 1).llm("each[1].ask", "x", "gpt-4o-mini", 10, 1)
	h.start("each[2].ask") // the third identical request is the one that was sent
	n, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.Note)
	require.True(t, ok)
	a := n.Data.(event.AnomalyDetectedData)
	require.Equal(t, event.AnomalyRunawayLoop, a.Type)
	require.Equal(t, "each[2].ask", a.StepID)
	require.Equal(t, 3.0, a.Observed)
	require.Equal(t, event.ActionHalt, a.Action, "the default action")
}

func TestTokenAndTimeLimits(t *testing.T) {
	t.Parallel()
	// draft's worst case: its request / 4 plus its cap, the room the
	// budget leaves: the call fits exactly.
	wf := withPolicy(t, wfSummarise, `{"budget":{"maxTokens":4000}}`)
	h := newStarted(t, testRun, wf, inputSummarise, nil).resume("w")
	rs, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.RunStep)
	require.True(t, ok, "the first call fits in 4000 tokens with a smaller cap")
	var in engine.AIInput
	require.NoError(t, json.Unmarshal(rs.Plan.Input, &in))
	need, _, _ := engine.EstimateCall(rs.Plan.Input, nil)
	require.Less(t, in.MaxTokens, engine.DefaultOutputTokens)
	require.LessOrEqual(t, need, 4000.0)
	require.Greater(t, need, 4000.0-4, "the room, to the token (a shorter cap may save a few bytes)")

	// With less room than MinOutputRoom, the call does not fit.
	wf = withPolicy(t, wfSummarise, `{"budget":{"maxTokens":200}}`)
	h = newStarted(t, testRun, wf, inputSummarise, nil).resume("w")
	n, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.Note)
	require.True(t, ok, "the first call does not fit in 200 tokens")
	x := n.Data.(event.BudgetExceededData)
	require.Equal(t, event.LimitTokens, x.Limit)
	require.Greater(t, x.Need, float64(engine.MinOutputRoom))

	wf = withPolicy(t, wfSummarise, `{"budget":{"maxDurationMs":1000}}`)
	h = newStarted(t, testRun, wf, inputSummarise, nil).resume("w")
	h.llm("draft", "x", "gpt-4o-mini", 10, 1)
	_, ok = engine.Next(h.st.Workflow, h.st, h.now).(engine.RunStep)
	require.True(t, ok, "within the second")
	n, ok = engine.Next(h.st.Workflow, h.st, h.now.Add(time.Second)).(engine.Note)
	require.True(t, ok, "a second after run_created, review is not started")
	require.Equal(t, event.LimitDuration, n.Data.(event.BudgetExceededData).Limit)

	// A model without a price is held only to the other limits.
	call := json.RawMessage(`{"model":"no-such-model","maxTokens":10,"messages":[]}`)
	tokens, cost, priced := engine.EstimateCall(call, event.Prices{"gpt-4o": {InputPerMTok: 1, OutputPerMTok: 1}})
	require.False(t, priced)
	require.Zero(t, cost)
	require.Greater(t, tokens, 10.0)
	tokens, cost, priced = engine.EstimateCall(call, event.Prices{"no-such-model": {InputPerMTok: 1e6, OutputPerMTok: 1e6}})
	require.True(t, priced)
	require.Equal(t, tokens, cost, "a dollar a token")
}
