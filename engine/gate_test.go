package engine_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

func gatedWorkflow(onLow string) string {
	return `{"name":"g","nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"q","retry":{"maxAttempts":2},
		 "confidence":{"min":0.8,"source":"logprobs","onLow":"` + onLow + `"}}}],
		"edges":[{"from":"start","to":"draft"}]}`
}

// TestGateVerdictsFromTheJournal: once confidence_evaluated is journaled,
// Next plans the gate's verdict (never the call again), and every replay
// of the same journal plans the same.
func TestGateVerdictsFromTheJournal(t *testing.T) {
	t.Parallel()
	key := event.IdempotencyKey("run_a", "draft", 1)
	history := func(onLow string, passed bool, more ...event.Event) []event.Event {
		wf, _ := json.Marshal(json.RawMessage(gatedWorkflow(onLow)))
		evs := []event.Event{
			ev(1, event.RunCreated, "", 0, `{"input":{},"depth":0,"workflow":`+string(wf)+`}`),
			resumed(2),
			ev(3, event.StepStarted, "draft", 1, `{"node_id":"draft","node_type":"ai-step","input":{},"idempotency_key":"`+key+`"}`),
			ev(4, event.ConfidenceEvaluated, "draft", 1, `{"score":0.5,"min":0.8,"passed":`+strconv.FormatBool(passed)+
				`,"source":"logprobs","output":{"text":"a","model":"m","confidence":0.5},"usage":{"input_tokens":1,"output_tokens":1,"total_tokens":2,"cost_usd":0}}`),
		}
		for i, e := range more {
			e.Seq = uint64(5 + i)
			evs = append(evs, e)
		}
		return evs
	}
	plan := func(evs []event.Event) engine.StepPlan {
		st, err := engine.Fold(evs)
		require.NoError(t, err)
		a := engine.Next(st.Workflow, st, st.UpdatedAt)
		rs, ok := a.(engine.RunStep)
		require.True(t, ok, "%#v", a)
		// A replay decides the same.
		st2, err := engine.Fold(evs)
		require.NoError(t, err)
		require.Equal(t, a, engine.Next(st2.Workflow, st2, st2.UpdatedAt))
		return rs.Plan
	}
	for _, tt := range []struct {
		onLow  string
		passed bool
		want   string
	}{
		{"fail", true, engine.GateComplete},
		{"fail", false, engine.GateFail},
		{"route", false, engine.GateComplete},
		{"retry", false, engine.GateRetry},
	} {
		p := plan(history(tt.onLow, tt.passed))
		require.NotNil(t, p.Gate, tt.onLow)
		require.Nil(t, p.Confidence, "not scored again")
		require.Nil(t, p.Wait)
		require.Equal(t, tt.want, p.Gate.Verdict(), tt.onLow)
		require.JSONEq(t, `{"text":"a","model":"m","confidence":0.5}`, string(p.Gate.Output))
	}

	// approval: wait, then parked, then the decision.
	p := plan(history("approval", false))
	require.Equal(t, &engine.WaitPlan{Reason: event.WaitApproval}, p.Wait)
	waiting := ev(0, event.StepWaiting, "draft", 1, `{"reason":"approval"}`)
	p = plan(history("approval", false, waiting))
	require.True(t, p.Wait.Waiting)
	st, err := engine.Fold(history("approval", false, waiting))
	require.NoError(t, err)
	require.True(t, engine.WaitsOnGate(st, "draft"))
	approve := ev(0, event.ApprovalReceived, "draft", 0, `{"decision":"approve","approver":"ana"}`)
	p = plan(history("approval", false, waiting, approve))
	require.Nil(t, p.Wait)
	require.Equal(t, engine.GateBypass, p.Gate.Verdict())
	reject := ev(0, event.ApprovalReceived, "draft", 0, `{"decision":"reject","approver":"ana","comment":"no"}`)
	p = plan(history("approval", false, waiting, reject))
	require.Equal(t, engine.GateFail, p.Gate.Verdict())
	require.Equal(t, "step draft: confidence 0.5 (logprobs) is below the min of 0.8; rejected by ana: no", p.Gate.LowError("draft"))

	// A retried step is scored again on its next attempt.
	retrying := ev(0, event.StepRetrying, "draft", 1, `{"attempt":2,"of":2,"error":"low","class":"confidence","delay_ms":0}`)
	p = plan(history("retry", false, retrying))
	require.Nil(t, p.Gate)
	require.NotNil(t, p.Confidence)
	require.Equal(t, 2, p.Attempt)

	// A failed gate fails the run with low_confidence.
	failed := ev(0, event.StepFailed, "draft", 1, `{"error":"low","class":"confidence","duration_ms":0}`)
	st, err = engine.Fold(history("fail", false, failed))
	require.NoError(t, err)
	f, ok := engine.Next(st.Workflow, st, st.UpdatedAt).(engine.Fail)
	require.True(t, ok)
	require.Equal(t, event.CodeLowConfidence, f.Code)
}
