package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

// waitGoWorkflow waits for signal "go", then echoes.
const waitGoWorkflow = `{"name":"wait-go","nodes":[{"id":"start","type":"trigger"},
	{"id":"hold","type":"wait","data":{"signal":"go"}},
	{"id":"done","type":"tool","data":{"tool":"echo","input":{"n":"{{steps.hold.output.n}}"}}}],
	"edges":[{"from":"start","to":"hold"},{"from":"hold","to":"done"}]}`

func TestSignalOverREST(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	res := b.post(t, "/v1/runs", `{"workflow":`+waitGoWorkflow+`}`)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	id := res.json(t)["run_id"].(string)
	b.WaitFor(t, id, "the wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })

	before := b.journalState(t)
	m := requireError(t, b.post(t, "/v1/runs/"+id+"/signals/go", `{"n":`), 400, "bad_input")
	require.Equal(t, "payload", m["field"])
	big := fmt.Sprintf(`{"s":%q}`, strings.Repeat("x", runs.MaxSignalPayloadBytes))
	m = requireError(t, b.post(t, "/v1/runs/"+id+"/signals/go", big), 400, "bad_input")
	require.Equal(t, "payload", m["field"])
	m = requireError(t, b.post(t, "/v1/runs/"+id+"/signals/stop", `{}`), 409, "conflict")
	require.Contains(t, m["detail"], `no wait node waits for signal "stop"`)
	requireError(t, b.post(t, "/v1/runs/"+id+"/signals/go", `{}`, bearerOf("")...), 401, "unauthorized")
	require.Equal(t, before, b.journalState(t), "refused signals write nothing")

	res = b.post(t, "/v1/runs/"+id+"/signals/go", `{"n":7}`)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	got := b.WaitFor(t, id, "the signal", func(ev event.Event) bool { return ev.Kind == event.SignalReceived })
	require.Equal(t, "ci", got.WorkerID, "the token names the sender")
	requireError(t, b.post(t, "/v1/runs/"+id+"/signals/go", `{}`), 409, "conflict")
}

func TestResumeOverREST(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	ctx := context.Background()
	res := b.post(t, "/v1/runs", `{"workflow":`+waitGoWorkflow+`}`)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	id := res.json(t)["run_id"].(string)
	b.WaitFor(t, id, "the wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	require.Eventually(t, func() bool { h, err := b.Leases.Holder(ctx, id); return err == nil && h == "" }, 10*time.Second, 10*time.Millisecond)

	// Someone holds the parked run's lease (a worker that froze as it took
	// it): a plain resume is refused, naming the holder.
	_, err := b.Leases.Acquire(ctx, id, "frozen-7")
	require.NoError(t, err)
	m := requireError(t, b.post(t, "/v1/runs/"+id+"/resume", ``), 409, runs.CodeLeaseHeld)
	require.Contains(t, m["detail"], "held by frozen-7")
	m = requireError(t, b.post(t, "/v1/runs/"+id+"/resume?force=true", ``), 403, "forbidden")
	require.Equal(t, "force", m["field"])
	requireError(t, b.post(t, "/v1/runs/"+id+"/resume?force=maybe", ``, bearerOf(adminToken)...), 400, "bad_input")

	res = b.post(t, "/v1/runs/"+id+"/resume", `{"force":true}`, bearerOf(adminToken)...)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	got := res.json(t)
	require.Equal(t, "frozen-7", got["broke"])
	require.Contains(t, got["taken_by"], "w1", "the worker takes the run at once")
	// It still waits for its signal: the worker looks, lets go and acks.
	require.Eventually(t, func() bool {
		h, err := b.Leases.Holder(ctx, id)
		p, perr := b.Store.WorkPending(ctx, "", id)
		return err == nil && perr == nil && h == "" && !p
	}, 10*time.Second, 10*time.Millisecond)

	require.Equal(t, http.StatusOK, b.post(t, "/v1/runs/"+id+"/signals/go", `{"n":1}`).status)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	m = requireError(t, b.post(t, "/v1/runs/"+id+"/resume", ``), 409, "conflict")
	require.Contains(t, m["detail"], "pal run retry "+id)
	requireError(t, b.post(t, "/v1/runs/run_nope/resume", ``), 404, "not_found")
}

func TestForkAndRetryOverREST(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	res := b.post(t, "/v1/runs", `{"workflow":`+seqWorkflow(3)+`,"input":{"topic":"rest"}}`)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	src := res.json(t)["run_id"].(string)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, src).Kind)

	before := b.journalState(t)
	m := requireError(t, b.post(t, "/v1/runs/"+src+"/fork", `{"from":"nope"}`), 400, "bad_input")
	require.Equal(t, "from", m["field"])
	requireError(t, b.post(t, "/v1/runs/"+src+"/fork", `{}`), 400, "bad_input")
	m = requireError(t, b.post(t, "/v1/runs/"+src+"/retry", ``), 409, "conflict")
	require.Contains(t, m["detail"], "succeeded")
	require.Equal(t, before, b.journalState(t))

	res = b.post(t, "/v1/runs/"+src+"/fork", `{"from":"s2"}`)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	got := res.json(t)
	fork := got["run_id"].(string)
	require.Equal(t, "/v1/runs/"+fork, res.header.Get("Location"))
	require.Equal(t, []any{"s1"}, got["copied"])
	require.Equal(t, map[string]any{"run_id": src, "step_id": "s2", "seq": float64(5)}, got["forked_from"])
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, fork).Kind)
	keys := b.LLM.Keys()
	require.Zero(t, keys[event.IdempotencyKey(fork, "s1", 1)], "s1 was copied")
	require.Equal(t, 1, keys[event.IdempotencyKey(fork, "s2", 1)])
	require.Equal(t, 1, keys[event.IdempotencyKey(fork, "s3", 1)])

	// The fork's view names its source and marks what it copied.
	var view runs.RunView
	require.NoError(t, json.Unmarshal(b.get(t, "/v1/runs/"+fork).body, &view))
	require.Equal(t, &runs.ForkPoint{RunID: src, StepID: "s2", Seq: 5}, view.ForkedFrom)
	require.Len(t, view.Steps, 3)
	require.NotNil(t, view.Steps[0].CopiedFrom)
	require.Equal(t, src, view.Steps[0].CopiedFrom.RunID)
	require.Nil(t, view.Steps[1].CopiedFrom)
	var wf runs.Waterfall
	require.NoError(t, json.Unmarshal(b.get(t, "/v1/runs/"+fork+"/waterfall").body, &wf))
	require.Equal(t, view.ForkedFrom, wf.ForkedFrom)
	require.NotNil(t, wf.Rows[0].CopiedFrom)
	require.Nil(t, wf.Rows[2].CopiedFrom)
}
