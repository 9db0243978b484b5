package api_test

import (
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
)

func TestBudgetThroughREST(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	wf := `{"name":"two","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"tool","data":{"tool":"echo"}},{"id":"b","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"a"},{"from":"a","to":"b"}],
		"policy":{"budget":{"maxSteps":2,"onExceed":"pause"}}}`
	before := b.journalState(t)
	m := requireError(t, b.post(t, "/v1/runs", `{"workflow":`+wf+`,"budget":{"maxSteps":5}}`), 400, "bad_input")
	require.Equal(t, "budget", m["field"])
	require.Contains(t, m["detail"], "widens the workflow's limit of 2")
	require.Equal(t, before, b.journalState(t), "a refused start writes nothing")

	res := b.post(t, "/v1/runs", `{"workflow":`+wf+`,"budget":{"maxSteps":1}}`)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	id := res.json(t)["run_id"].(string)
	b.WaitFor(t, id, "the budget wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	v := b.get(t, "/v1/runs/"+id).json(t)
	require.Equal(t, "waiting", v["status"])
	require.Equal(t, "budget", v["paused_on"])
	require.Equal(t, map[string]any{"max_steps": 1.0, "on_exceed": "pause"}, v["budget"])
	require.Equal(t, 1.0, v["spent"].(map[string]any)["steps"])

	requireError(t, b.post(t, "/v1/runs/"+id+"/budget", `{"add_usd":1}`), 400, "bad_input")
	requireError(t, b.post(t, "/v1/runs/"+id+"/budget", `{"add_steps":-1}`), 400, "bad_input")
	requireError(t, b.post(t, "/v1/runs/"+id+"/budget", `{}`), 400, "bad_input")
	res = b.post(t, "/v1/runs/"+id+"/budget", `{"add_steps":1}`)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	raised := b.WaitFor(t, id, "the raise", func(ev event.Event) bool { return ev.Kind == event.BudgetRaised })
	require.Equal(t, "ci", raised.WorkerID, "the token's name raised it")
	requireError(t, b.post(t, "/v1/runs/"+id+"/budget", `{"add_steps":1}`), 409, "conflict")
}

func TestAnomalyPauseApprovedThroughREST(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	var n atomic.Int32
	b.LLM.SetResponder(func(providertest.Call) providertest.Reply {
		if n.Add(1) <= 2 {
			return providertest.Reply{ToolCalls: []provider.ToolCall{{ID: "c", Name: "echo", Arguments: json.RawMessage(`{"q":1}`)}}}
		}
		return providertest.Reply{Text: "found it"}
	})
	wf := `{"name":"agent","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"m","prompt":"go","tools":[{"name":"echo"}]}}],
		"edges":[{"from":"start","to":"ask"}],
		"policy":{"anomalies":{"runaway_loop":{"threshold":2,"action":"pause"}}}}`
	res := b.post(t, "/v1/runs", `{"workflow":`+wf+`}`)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	id := res.json(t)["run_id"].(string)
	w := b.WaitFor(t, id, "the anomaly wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	require.Equal(t, "ask.turn[1]", w.StepID)
	require.Equal(t, "anomaly", b.get(t, "/v1/runs/"+id).json(t)["paused_on"])
	res = b.post(t, "/v1/runs/"+id+"/approve", `{"step_id":"ask.turn[1]","decision":"approve"}`)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	require.Equal(t, int32(3), n.Load())
}
