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

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/runs"
)

// chatWorkflow is one ai-step that continues the run's thread.
const chatWorkflow = `{"name":"chat","nodes":[{"id":"start","type":"trigger"},
	{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"{{input.q}}","thread":true}}],
	"edges":[{"from":"start","to":"ask"}]}`

// A start names a thread over REST and over the NATS service; GET
// /v1/threads/{id} shows the conversation both runs made, GET
// /v1/runs?thread= lists them, and a bad thread id is 400 naming the
// field, with nothing written.
func TestThreadOverREST(t *testing.T) {
	t.Parallel()
	pool := migratedPool(t)
	ctx := context.Background()
	b := setup(t, withWorker(), withRuns(projections.NewReader(pool)))
	p := b.project(t, pool)
	svc, err := api.StartService(ctx, b.NC, b.Runs, paltest.Logger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })

	res := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":%s,"input":{"q":"first"},"thread":"api-t"}`, chatWorkflow))
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	first := res.json(t)["run_id"].(string)
	b.WaitEnd(t, first)
	m, err := b.NC.Request("pal.api.runs.start", []byte(`{"workflow":"chat","input":{"q":"second"},"thread":"api-t"}`), 10*time.Second)
	require.NoError(t, err)
	var started struct {
		RunID string `json:"run_id"`
	}
	require.NoError(t, json.Unmarshal(m.Data, &started), string(m.Data))
	require.NotEmpty(t, started.RunID, string(m.Data))
	second := started.RunID
	b.WaitEnd(t, second)

	res = b.get(t, "/v1/threads/api-t")
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	var v runs.ThreadView
	require.NoError(t, json.Unmarshal(res.body, &v))
	require.Equal(t, "api-t", v.Thread)
	var got []string
	for _, tr := range v.Turns {
		require.Equal(t, "ask", tr.StepID)
		got = append(got, tr.RunID+" "+tr.Role+" "+tr.Content)
	}
	require.Equal(t, []string{first + " user first", first + " assistant echo: first",
		second + " user second", second + " assistant echo: second"}, got)
	require.Equal(t, []uint64{2, 2, 4, 4}, []uint64{v.Turns[0].Seq, v.Turns[1].Seq, v.Turns[2].Seq, v.Turns[3].Seq})
	require.NotNil(t, v.Holds)
	require.Empty(t, v.Holds)
	require.Positive(t, v.Bytes)

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, p.WaitCaughtUp(wctx))
	res = b.get(t, "/v1/runs?thread=api-t")
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	var l runs.RunList
	require.NoError(t, json.Unmarshal(res.body, &l))
	require.Len(t, l.Runs, 2)
	require.Equal(t, []string{second, first}, []string{l.Runs[0].RunID, l.Runs[1].RunID})
	require.Equal(t, "api-t", l.Runs[0].Thread)
	res = b.get(t, "/v1/runs/"+first)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, "api-t", res.json(t)["thread"])

	requireError(t, b.get(t, "/v1/threads/never-used"), http.StatusNotFound, "not_found")
	for _, path := range []string{"/v1/threads/a.b", "/v1/threads/" + strings.Repeat("t", 129), "/v1/runs?thread=a*b", "/v1/runs?thread="} {
		m := requireError(t, b.get(t, path), http.StatusBadRequest, "bad_input")
		require.Equal(t, "thread", m["field"], path)
	}
	before := b.journalState(t)
	for _, thread := range []string{`"a.b"`, `"a b"`, `"` + strings.Repeat("t", 129) + `"`, `""x`, `7`} {
		res := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":"chat","thread":%s}`, thread))
		require.Equal(t, http.StatusBadRequest, res.status, "%s: %s", thread, res.body)
		if thread != `""x` {
			m := requireError(t, res, http.StatusBadRequest, "bad_input")
			require.Equal(t, "thread", m["field"], thread)
		}
	}
	require.Equal(t, before, b.journalState(t), "nothing written")
}
