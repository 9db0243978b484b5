package workers_test

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// TestConfidenceApprovalParksAndBypasses: a pal worker process scores an
// answer by its log probabilities (exp(mean) = e⁻¹ ≈ 0.37, under the min
// of 0.8). With onLow approval the run parks; an approver accepting the
// score journals confidence_gate_bypassed and the step completes with the
// answer it had, without calling the provider again.
func TestConfidenceApprovalParksAndBypasses(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	p.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		return providertest.Reply{Text: "probably Paris", Logprobs: []float64{-0.5, -1.5}}
	})
	p.palWorker(t, "w1")
	wf := `{"name":"gated","nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"capital of France?",
		 "confidence":{"min":0.8,"source":"logprobs","onLow":"approval"}}}],
		"edges":[{"from":"start","to":"draft"}]}`
	runID := p.Start(t, wf, `{}`)
	p.WaitFor(t, runID, "the gate parks the run", func(ev event.Event) bool {
		return ev.Kind == event.StepWaiting && ev.StepID == "draft"
	})
	evs := p.Events(t, runID)
	w := data[event.StepWaitingData](t, find(evs, event.StepWaiting, "draft")[0])
	require.Equal(t, event.WaitApproval, w.Reason)
	ce := data[event.ConfidenceEvaluatedData](t, find(evs, event.ConfidenceEvaluated, "draft")[0])
	require.InDelta(t, math.Exp(-1), ce.Score, 1e-9)
	require.Equal(t, 0.8, ce.Min)
	require.False(t, ce.Passed)
	require.Equal(t, "logprobs", ce.Source)
	require.Empty(t, find(evs, event.StepCompleted, "draft"))
	calls := p.LLM.Calls()
	require.Len(t, calls, 1)
	require.True(t, calls[0].Logprobs, "log probabilities were asked for")

	ctx := ctxFor(t, time.Minute)
	require.ErrorIs(t, p.Runs.Approve(ctx, runs.ApproveCommand{RunID: runID, StepID: "start", Decision: "approve", Approver: "alice"}),
		runs.ErrNotWaiting, "only the parked step can be approved")
	require.NoError(t, p.Runs.Approve(ctx, runs.ApproveCommand{RunID: runID, StepID: "draft", Decision: "approve",
		Approver: "alice", Comment: "checked by hand"}))
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)

	evs = p.Events(t, runID)
	by := find(evs, event.ConfidenceGateBypassed, "draft")
	require.Len(t, by, 1)
	require.Equal(t, event.ConfidenceGateBypassedData{By: "alice", Reason: "checked by hand"}, data[event.ConfidenceGateBypassedData](t, by[0]))
	require.Len(t, find(evs, event.ConfidenceEvaluated, ""), 1, "scored once")
	out := data[event.StepCompletedData](t, find(evs, event.StepCompleted, "draft")[0])
	var llm engine.LLMOutput
	require.NoError(t, jsonUnmarshal(out.Output, &llm))
	require.Equal(t, "probably Paris", llm.Text)
	require.InDelta(t, math.Exp(-1), *llm.Confidence, 1e-9)
	require.NotNil(t, out.Usage)
	require.Len(t, p.LLM.Calls(), 1, "the approved answer was not asked for again")
}

// TestConfidenceRejectedFailsTheRun: rejecting a low score fails the run
// with code low_confidence.
func TestConfidenceRejectedFailsTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		return providertest.Reply{Text: `{"answer":"x","meta":{"confidence":0.1}}`}
	})
	wf := `{"name":"gated","nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"ai-step","data":{"provider":"anthropic","model":"claude-haiku-4-5","prompt":"q",
		 "confidence":{"min":0.5,"source":"field","field":"meta.confidence","onLow":"approval"}}}],
		"edges":[{"from":"start","to":"draft"}]}`
	runID := b.Start(t, wf, `{}`)
	b.WaitFor(t, runID, "parked", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	require.NoError(t, b.Runs.Approve(context.Background(), runs.ApproveCommand{RunID: runID, StepID: "draft",
		Decision: "reject", Approver: "bob", Comment: "wrong"}))
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	rf := data[event.RunFailedData](t, end)
	require.Equal(t, event.CodeLowConfidence, rf.Code)
	require.Contains(t, rf.Error, "confidence 0.1 (field) is below the min of 0.5; rejected by bob: wrong")
	require.Empty(t, find(b.Events(t, runID), event.ConfidenceGateBypassed, ""))
}

// TestConfidenceRouteChoosesTheBranch: with onLow route the step
// completes with output.confidence and the edges choose: a low score goes
// to review, a high one to publish, in a pal worker process.
func TestConfidenceRouteChoosesTheBranch(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	p.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		score := "0.3"
		if strings.Contains(c.LastUser(), "easy") {
			score = "0.95"
		}
		return providertest.Reply{Text: "```json\n{\"answer\":\"42\",\"confidence\":" + score + "}\n```"}
	})
	p.palWorker(t, "w1")
	wf := `{"name":"routed","nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"{{input.q}}",
		 "confidence":{"min":0.8,"source":"field","field":"confidence","onLow":"route"}}},
		{"id":"publish","type":"tool","data":{"tool":"echo","input":{"to":"publish"}}},
		{"id":"review","type":"tool","data":{"tool":"echo","input":{"to":"review"}}}],
		"edges":[{"from":"start","to":"draft"},
		 {"from":"draft","to":"publish","condition":"steps.draft.output.confidence >= 0.8"},
		 {"from":"draft","to":"review","condition":"steps.draft.output.confidence < 0.8"}]}`
	hard := p.Start(t, wf, `{"q":"hard question"}`)
	easy := p.Start(t, wf, `{"q":"easy question"}`)
	for id, want := range map[string]string{hard: "review", easy: "publish"} {
		require.Equal(t, event.RunSucceeded, p.WaitEnd(t, id).Kind)
		evs := p.Events(t, id)
		require.Len(t, find(evs, event.StepCompleted, want), 1, want)
		other := map[string]string{"review": "publish", "publish": "review"}[want]
		require.Empty(t, find(evs, event.StepStarted, other), other)
		require.Len(t, find(evs, event.ConfidenceEvaluated, "draft"), 1)
	}
}

// TestConfidenceRetryThenFail: a judge scores every answer 0.2; with
// onLow retry and maxAttempts 2 the step is tried twice (two keys, two
// judge calls), then the run fails with low_confidence.
func TestConfidenceRetryThenFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		if c.Model == "judge-model" {
			return providertest.Reply{Text: "Score: 0.2"}
		}
		return providertest.Reply{Text: "an answer"}
	})
	wf := `{"name":"judged","nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"q",
		 "retry":{"maxAttempts":2},
		 "confidence":{"min":0.7,"source":"judge","onLow":"retry",
		  "judge":{"provider":"anthropic","model":"judge-model","prompt":"Rate the answer from 0 to 1."}}}}],
		"edges":[{"from":"start","to":"draft"}]}`
	runID := b.Start(t, wf, `{}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	require.Equal(t, event.CodeLowConfidence, data[event.RunFailedData](t, end).Code)
	evs := b.Events(t, runID)
	require.Len(t, find(evs, event.ConfidenceEvaluated, "draft"), 2)
	retries := find(evs, event.StepRetrying, "draft")
	require.Len(t, retries, 1)
	rd := data[event.StepRetryingData](t, retries[0])
	require.Equal(t, 2, rd.Attempt)
	require.Equal(t, event.ClassConfidence, rd.Class)
	require.Equal(t, map[string]int{
		key(runID, "draft", 1): 1, key(runID, "draft", 1) + ".judge": 1,
		key(runID, "draft", 2): 1, key(runID, "draft", 2) + ".judge": 1,
	}, b.LLM.Keys())
	judge := b.LLM.CallsWithKey(key(runID, "draft", 1) + ".judge")[0]
	require.Equal(t, "Rate the answer from 0 to 1.", judge.System)
	require.Equal(t, "an answer", judge.LastUser())
	// The judge's tokens count in the step's usage.
	ce := data[event.ConfidenceEvaluatedData](t, find(evs, event.ConfidenceEvaluated, "draft")[0])
	require.Equal(t, int64((1+2)+(7+2+2)), ce.Usage.TotalTokens, "main call, then the judge: system and answer in, its score out")
	require.True(t, ce.Usage.CostUnknown, "judge-model has no price")
}

// TestConfidenceGateOffByPolicy: policy.confidenceGate "off" scores
// nothing and journals confidence_gate_bypassed by policy, once.
func TestConfidenceGateOffByPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	wf := `{"name":"ungated","policy":{"confidenceGate":"off"},"nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"q",
		 "confidence":{"min":0.99,"source":"logprobs","onLow":"fail"}}}],
		"edges":[{"from":"start","to":"draft"}]}`
	runID := b.Start(t, wf, `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	evs := b.Events(t, runID)
	require.Empty(t, find(evs, event.ConfidenceEvaluated, ""))
	by := find(evs, event.ConfidenceGateBypassed, "draft")
	require.Len(t, by, 1)
	require.Equal(t, event.BypassedByPolicy, data[event.ConfidenceGateBypassedData](t, by[0]).By)
	require.False(t, b.LLM.Calls()[0].Logprobs)
}

func jsonUnmarshal(raw []byte, v any) error { return json.Unmarshal(raw, v) }

// TestConfidenceGatesAnAgentsFinalAnswer: an agent's turn that calls a
// tool is not scored; its final answer is, and a low score with onLow
// fail ends the run with low_confidence.
func TestConfidenceGatesAnAgentsFinalAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		if len(c.Messages) == 1 {
			return providertest.Reply{ToolCalls: []provider.ToolCall{{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"x":1}`)}},
				Logprobs: []float64{0}}
		}
		return providertest.Reply{Text: "done", Logprobs: []float64{-2, -2}}
	})
	wf := `{"name":"agentic","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"go",
		 "tools":[{"name":"echo"}],"confidence":{"min":0.5,"source":"logprobs"}}}],
		"edges":[{"from":"start","to":"ask"}]}`
	runID := b.Start(t, wf, `{}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	rf := data[event.RunFailedData](t, end)
	require.Equal(t, event.CodeLowConfidence, rf.Code)
	require.Equal(t, "ask.turn[1]", rf.StepID)
	evs := b.Events(t, runID)
	ce := find(evs, event.ConfidenceEvaluated, "")
	require.Len(t, ce, 1)
	require.Equal(t, "ask.turn[1]", ce[0].StepID)
	require.InDelta(t, math.Exp(-2), data[event.ConfidenceEvaluatedData](t, ce[0]).Score, 1e-9)
}
