package api_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/runs"
)

// TestBadInput sends every kind of bad request and checks that each gets
// a clear error and leaves the journal, the work queue, the commands and
// the leases exactly as they were.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t) // no worker: nothing moves but what the requests write
	ctx := context.Background()
	queued, err := runs.New(b.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: "run_queued", Workflow: json.RawMessage(seqWorkflow(2))})
	require.NoError(t, err)
	_, err = runs.New(b.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: "run_done", Workflow: json.RawMessage(echoWorkflow)})
	require.NoError(t, err)
	require.NoError(t, runs.New(b.Store, runs.WithConn(nil)).Cancel(ctx, runs.CancelCommand{RunID: "run_done", Reason: "setup"}))

	wf := echoWorkflow
	big := `{"workflow":` + wf + `,"input":{"pad":"` + strings.Repeat("x", api.MaxBodyBytes) + `"}}`
	cases := []struct {
		name, method, path, body string
		headers                  []string
		chunked                  bool
		status                   int
		code, field, detail      string
	}{
		{name: "malformed JSON", method: "POST", path: "/v1/runs", body: `{"workflow":`, status: 400, code: "bad_input", detail: "malformed JSON"},
		{name: "not JSON", method: "POST", path: "/v1/runs", body: `workflow=x`, status: 400, code: "bad_input", detail: "want a JSON object"},
		{name: "empty body", method: "POST", path: "/v1/runs", body: ``, status: 400, code: "bad_input", detail: "empty body"},
		{name: "trailing data", method: "POST", path: "/v1/runs", body: `{"workflow":` + wf + `} {}`, status: 400, code: "bad_input", detail: "after the JSON object"},
		{name: "unknown field", method: "POST", path: "/v1/runs", body: `{"workflow":` + wf + `,"bogus":1}`, status: 400, code: "bad_input", field: "bogus", detail: "unknown field"},
		{name: "reply_to is not for REST", method: "POST", path: "/v1/runs", body: `{"workflow":` + wf + `,"reply_to":"x"}`, status: 400, code: "bad_input", field: "reply_to"},
		{name: "wrong type run_id", method: "POST", path: "/v1/runs", body: `{"workflow":` + wf + `,"run_id":42}`, status: 400, code: "bad_input", field: "run_id", detail: "wrong type"},
		{name: "wrong type workflow", method: "POST", path: "/v1/runs", body: `{"workflow":42}`, status: 400, code: "bad_input", field: "workflow"},
		{name: "workflow not deployed", method: "POST", path: "/v1/runs", body: `{"workflow":"hello"}`, status: 404, code: "not_found", detail: "workflow hello: workflow not deployed"},
		{name: "bad workflow version", method: "POST", path: "/v1/runs", body: `{"workflow":"hello@x"}`, status: 400, code: "bad_input", field: "workflow"},
		{name: "missing workflow", method: "POST", path: "/v1/runs", body: `{"input":{}}`, status: 400, code: "bad_input", field: "workflow", detail: "required"},
		{name: "invalid workflow", method: "POST", path: "/v1/runs", body: `{"workflow":{"name":"x","nodes":[{"id":"a","type":"teleport"}],"edges":[]}}`, status: 400, code: "bad_input", field: "workflow"},
		{name: "oversized body", method: "POST", path: "/v1/runs", body: big, status: 413, code: "too_large"},
		{name: "oversized body, chunked", method: "POST", path: "/v1/runs", body: big, chunked: true, status: 413, code: "too_large"},
		{name: "oversized approval", method: "POST", path: "/v1/runs/run_queued/approve", body: `{"step_id":"s1","decision":"approve","comment":"` + strings.Repeat("x", api.MaxBodyBytes) + `"}`, chunked: true, status: 413, code: "too_large"},
		{name: "run id with a dot", method: "POST", path: "/v1/runs", body: `{"workflow":` + wf + `,"run_id":"a.b"}`, status: 400, code: "bad_input", field: "run_id", detail: "would change the NATS subject"},
		{name: "run id >", method: "POST", path: "/v1/runs", body: `{"workflow":` + wf + `,"run_id":">"}`, status: 400, code: "bad_input", field: "run_id"},
		{name: "run id *", method: "POST", path: "/v1/runs", body: `{"workflow":` + wf + `,"run_id":"*"}`, status: 400, code: "bad_input", field: "run_id"},
		{name: "run id with a space", method: "POST", path: "/v1/runs", body: `{"workflow":` + wf + `,"run_id":"a b"}`, status: 400, code: "bad_input", field: "run_id"},
		{name: "get a.*", method: "GET", path: "/v1/runs/run_queued.*", status: 400, code: "bad_input", field: "run_id"},
		{name: "get >", method: "GET", path: "/v1/runs/%3E", status: 400, code: "bad_input", field: "run_id"},
		{name: "events of *", method: "GET", path: "/v1/runs/%2A/events", status: 400, code: "bad_input", field: "run_id"},
		{name: "cancel a.>", method: "POST", path: "/v1/runs/run_done.%3E/cancel", status: 400, code: "bad_input", field: "run_id"},
		{name: "approve with a slash", method: "POST", path: "/v1/runs/run_queued%2Fx/approve", body: `{"step_id":"s1","decision":"approve"}`, status: 400, code: "bad_input", field: "run_id"},
		{name: "approve a step that is not waiting", method: "POST", path: "/v1/runs/run_queued/approve", body: `{"step_id":"s1","decision":"approve","approver":"ci"}`, status: 409, code: "conflict", detail: "not waiting"},
		{name: "approve an unknown step", method: "POST", path: "/v1/runs/run_queued/approve", body: `{"step_id":"nope","decision":"reject"}`, status: 409, code: "conflict", detail: "not waiting"},
		{name: "approve in a finished run", method: "POST", path: "/v1/runs/run_done/approve", body: `{"step_id":"a","decision":"approve"}`, status: 409, code: "conflict", detail: "already finished"},
		{name: "approve another run's id", method: "POST", path: "/v1/runs/run_queued/approve", body: `{"run_id":"run_done","step_id":"s1","decision":"approve"}`, status: 400, code: "bad_input", field: "run_id", detail: "does not match"},
		{name: "approve without decision", method: "POST", path: "/v1/runs/run_queued/approve", body: `{"step_id":"s1"}`, status: 400, code: "bad_input", field: "decision"},
		{name: "approve without step", method: "POST", path: "/v1/runs/run_queued/approve", body: `{"decision":"approve"}`, status: 400, code: "bad_input", field: "step_id"},
		{name: "approve, wrong type", method: "POST", path: "/v1/runs/run_queued/approve", body: `{"step_id":["s1"],"decision":"approve"}`, status: 400, code: "bad_input", field: "step_id", detail: "wrong type"},
		{name: "cancel, unknown field", method: "POST", path: "/v1/runs/run_queued/cancel", body: `{"why":"x"}`, status: 400, code: "bad_input", field: "why"},
		{name: "cancel another run's id", method: "POST", path: "/v1/runs/run_queued/cancel", body: `{"run_id":"run_done"}`, status: 400, code: "bad_input", field: "run_id"},
		{name: "cancel a finished run", method: "POST", path: "/v1/runs/run_done/cancel", body: `{"reason":"again"}`, status: 409, code: "conflict", detail: "already finished (cancelled)"},
		{name: "get an unknown run", method: "GET", path: "/v1/runs/run_nope", status: 404, code: "not_found", detail: "run run_nope not found"},
		{name: "events of an unknown run", method: "GET", path: "/v1/runs/run_nope/events", status: 404, code: "not_found"},
		{name: "cancel an unknown run", method: "POST", path: "/v1/runs/run_nope/cancel", status: 404, code: "not_found"},
		{name: "approve in an unknown run", method: "POST", path: "/v1/runs/run_nope/approve", body: `{"step_id":"s1","decision":"approve"}`, status: 404, code: "not_found"},
		{name: "bad Last-Event-ID", method: "GET", path: "/v1/runs/run_queued/events", headers: []string{"Last-Event-ID", "x"}, status: 400, code: "bad_input", field: "Last-Event-ID"},
		{name: "huge Last-Event-ID", method: "GET", path: "/v1/runs/run_queued/events", headers: []string{"Last-Event-ID", strings.Repeat("9", 60000)}, status: 400, code: "bad_input", field: "Last-Event-ID"},
		{name: "huge after", method: "GET", path: "/v1/runs/run_queued/events?after=" + strings.Repeat("9", 60000), status: 400, code: "bad_input", field: "after"},
		{name: "huge query key", method: "GET", path: "/v1/runs/run_queued/events?" + strings.Repeat("k", 60000) + "=1", status: 400, code: "bad_input"},
		{name: "bad after", method: "GET", path: "/v1/runs/run_queued/events?after=-1", status: 400, code: "bad_input", field: "after"},
		{name: "unknown events parameter", method: "GET", path: "/v1/runs/run_queued/events?from=1", status: 400, code: "bad_input", field: "from"},
		{name: "no token", method: "POST", path: "/v1/runs", body: `{"workflow":` + wf + `}`, headers: []string{"Authorization", ""}, status: 401, code: "unauthorized", detail: "missing bearer token"},
		{name: "wrong token", method: "POST", path: "/v1/runs", body: `{"workflow":` + wf + `}`, headers: []string{"Authorization", "Bearer " + testToken + "x"}, status: 401, code: "unauthorized", detail: "invalid bearer token"},
		{name: "wrong scheme", method: "POST", path: "/v1/runs/run_queued/cancel", headers: []string{"Authorization", "Basic " + testToken}, status: 401, code: "unauthorized"},
		{name: "unknown route", method: "GET", path: "/v1/jobs", status: 404, code: "not_found", detail: "no such endpoint"},
		{name: "wrong method", method: "DELETE", path: "/v1/runs/run_queued", status: 405, code: "method_not_allowed"},
		{name: "list without Postgres", method: "GET", path: "/v1/runs", status: 503, code: "unavailable", detail: "listing runs needs DATABASE_URL"},
	}
	before := b.journalState(t)
	require.Len(t, before.Journal, 2)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
				if tc.chunked {
					body = io.MultiReader(body) // hides the length: sent chunked
				}
			}
			res := b.do(t, tc.method, tc.path, body, tc.headers...)
			m := requireError(t, res, tc.status, tc.code)
			if tc.field != "" {
				require.Equal(t, tc.field, m["field"], "body: %s", res.body)
			}
			require.Contains(t, m["detail"], tc.detail)
			require.Less(t, len(res.body), 1024, "an answer does not echo a huge input")
			if tc.status == 401 {
				require.Contains(t, res.header.Get("WWW-Authenticate"), "Bearer")
			}
			if tc.status == 405 {
				require.Equal(t, "GET, HEAD", res.header.Get("Allow"))
			}
			require.Equal(t, before, b.journalState(t), "a refused request changed the journal")
		})
	}
	require.Equal(t, queued.RunID, "run_queued")
}

func TestStartGetCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	hold := b.LLM.Hold(nil) // every LLM call waits: the run stays in flight
	t.Cleanup(hold.Release)

	// Idempotency-Key header: a duplicate answers 200 with the same run.
	body := `{"workflow":` + seqWorkflow(2) + `,"input":{"topic":"PAL"}}`
	res := b.post(t, "/v1/runs", body, "Idempotency-Key", "order-17")
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	m := res.json(t)
	runID := m["run_id"].(string)
	require.Equal(t, runs.RunIDForKey("order-17"), runID)
	require.Equal(t, true, m["created"])
	require.Equal(t, "/v1/runs/"+runID, res.header.Get("Location"))
	res = b.post(t, "/v1/runs", body, "Idempotency-Key", "order-17")
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, map[string]any{"run_id": runID, "created": false}, res.json(t))
	// The body's key wins over the header's.
	res = b.post(t, "/v1/runs", `{"workflow":`+echoWorkflow+`,"idempotency_key":"body-key"}`, "Idempotency-Key", "order-17")
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	require.Equal(t, runs.RunIDForKey("body-key"), res.json(t)["run_id"])
	// A run id of the caller's choosing, once.
	res = b.post(t, "/v1/runs", `{"workflow":`+echoWorkflow+`,"run_id":"run_mine-1"}`)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	requireError(t, b.post(t, "/v1/runs", `{"workflow":`+echoWorkflow+`,"run_id":"run_mine-1"}`), 409, "conflict")

	// run_created names the token that started the run.
	require.Equal(t, "ci", b.Events(t, runID)[0].WorkerID)
	call, err := hold.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, event.IdempotencyKey(runID, "s1", 1), call.IdempotencyKey)

	res = b.get(t, "/v1/runs/"+runID)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	var view runs.RunView
	require.NoError(t, json.Unmarshal(res.body, &view))
	require.Equal(t, runID, view.RunID)
	require.Equal(t, "running", string(view.Status))
	require.Equal(t, "seq-2", view.Workflow)
	require.JSONEq(t, `{"topic":"PAL"}`, string(view.Input))

	// Cancel with an empty body: the canceller is the token's name, and
	// the in-flight LLM call is abandoned.
	res = b.post(t, "/v1/runs/"+runID+"/cancel", "")
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, map[string]any{"ok": true, "run_id": runID}, res.json(t))
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunCancelled, final.Kind)
	require.Equal(t, "ci", final.WorkerID)
	var cd event.RunCancelledData
	require.NoError(t, final.DecodeData(&cd))
	require.Equal(t, "ci", cd.By)
	n := len(b.Events(t, runID))
	requireError(t, b.post(t, "/v1/runs/"+runID+"/cancel", `{"reason":"twice"}`), 409, "conflict")
	require.Len(t, b.Events(t, runID), n, "a second cancel wrote something")
	res = b.get(t, "/v1/runs/"+runID)
	require.Equal(t, "cancelled", res.json(t)["status"])

	// A body may repeat the run id, and an admin token may name the
	// canceller.
	other := b.post(t, "/v1/runs", `{"workflow":`+seqWorkflow(1)+`,"input":{"topic":"x"}}`).json(t)["run_id"].(string)
	res = b.post(t, "/v1/runs/"+other+"/cancel", fmt.Sprintf(`{"run_id":%q,"reason":"test","by":"ops"}`, other), bearerOf(adminToken)...)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	final = b.WaitEnd(t, other)
	require.Equal(t, "ops", final.WorkerID)
}

func TestAuth(t *testing.T) {
	t.Parallel()
	tokens, err := api.ParseTokens("ci=" + testToken + ", second-token-abc")
	require.NoError(t, err)
	b := setup(t, withTokens(tokens, false))
	_, err = runs.New(b.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights, RunID: "run_a", Workflow: json.RawMessage(echoWorkflow)})
	require.NoError(t, err)

	for _, h := range []string{"", "Bearer", "Bearer ", "Basic " + testToken, "Bearer " + testToken[:len(testToken)-1],
		"Bearer second-token-ab", "Bearer x" + testToken} {
		res := b.get(t, "/v1/runs/run_a", "Authorization", h)
		requireError(t, res, 401, "unauthorized")
		require.True(t, strings.HasPrefix(res.header.Get("WWW-Authenticate"), `Bearer realm="pal"`))
	}
	require.Equal(t, http.StatusOK, b.get(t, "/v1/runs/run_a").status)
	require.Equal(t, http.StatusOK, b.get(t, "/v1/runs/run_a", "Authorization", "bearer second-token-abc").status)
	// The unnamed token stands for "api".
	res := b.post(t, "/v1/runs/run_a/cancel", "", "Authorization", "Bearer second-token-abc")
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, "api", b.Events(t, "run_a")[1].WorkerID)
	// Health needs no token.
	require.Equal(t, http.StatusOK, b.get(t, "/healthz", "Authorization", "").status)
	require.Equal(t, http.StatusOK, b.get(t, "/readyz", "Authorization", "").status)
	requireError(t, b.post(t, "/healthz", "", "Authorization", ""), 405, "method_not_allowed")

	// No tokens and not insecure: every /v1 request is refused.
	closed := setup(t, withTokens(nil, false))
	requireError(t, closed.get(t, "/v1/runs/run_a"), 401, "unauthorized")
	// Insecure on purpose: no token needed, and with no one authenticated
	// there is no identity to hold a body to: it names the canceller.
	open := setup(t, withTokens(nil, true))
	requireError(t, open.get(t, "/v1/runs/run_a", "Authorization", ""), 404, "not_found")
	_, err = runs.New(open.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights, RunID: "run_o", Workflow: json.RawMessage(echoWorkflow)})
	require.NoError(t, err)
	res = open.post(t, "/v1/runs/run_o/cancel", `{"by":"ops"}`, "Authorization", "")
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, "ops", open.Events(t, "run_o")[1].WorkerID)
}

func TestParseTokens(t *testing.T) {
	t.Parallel()
	toks, err := api.ParseTokens(" alice=tok-a , tok-b,, ci.bot=tok=c ")
	require.NoError(t, err)
	d := api.DefaultScopes
	require.Equal(t, []api.Token{{Name: "alice", Secret: "tok-a", Scopes: d}, {Name: "api", Secret: "tok-b", Scopes: d}, {Name: "ci.bot", Secret: "tok=c", Scopes: d}}, toks)
	toks, err = api.ParseTokens("")
	require.NoError(t, err)
	require.Empty(t, toks)
	for in, want := range map[string]string{
		"a=":            "empty token",
		"bad name=x":    "name",
		"a=x y":         "white space",
		"a=one,b=one":   "listed twice",
		"=x":            "name",
		"a*b=something": "name",
	} {
		_, err := api.ParseTokens(in)
		require.ErrorContains(t, err, want, in)
		require.NotContains(t, err.Error(), "something", "an error must not quote the token")
	}
	tok, err := api.GenerateToken()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(tok, "pal_"))
	require.Len(t, tok, 4+43)
	parsed, err := api.ParseTokens(tok)
	require.NoError(t, err)
	require.Equal(t, tok, parsed[0].Secret)
}

func TestHealthAndReady(t *testing.T) {
	t.Parallel()
	var pgDown atomic.Bool
	b := setup(t, withReady(func(context.Context) error {
		if pgDown.Load() {
			return &api.NotReadyError{What: "Postgres", Err: fmt.Errorf("dial tcp 10.0.0.9:5432: connection refused")}
		}
		return nil
	}))
	require.Equal(t, map[string]any{"ok": true}, b.get(t, "/readyz").json(t))
	pgDown.Store(true)
	m := requireError(t, b.get(t, "/readyz"), 503, "unavailable")
	require.Equal(t, "Postgres is not reachable", m["detail"], "the cause stays in the log")
	pgDown.Store(false)

	b.NATS.Shutdown()
	m = requireError(t, b.get(t, "/readyz"), 503, "unavailable")
	require.Contains(t, m["detail"], "NATS")
	require.Equal(t, map[string]any{"ok": true}, b.get(t, "/healthz").json(t), "healthz says the process is up")

	b.NATS.Restart(t)
	require.Eventually(t, func() bool { return b.get(t, "/readyz").status == http.StatusOK }, 30*time.Second, 20*time.Millisecond)
}

func TestListRuns(t *testing.T) {
	t.Parallel()
	pool := migratedPool(t)
	ctx := context.Background()
	b := setup(t, withWorker(), withRuns(projections.NewReader(pool)))
	p := b.project(t, pool)

	var ids []string
	for i := range 3 {
		res := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":%s,"input":{"topic":"t%d"}}`, seqWorkflow(1), i))
		require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
		id := res.json(t)["run_id"].(string)
		b.WaitEnd(t, id)
		ids = append(ids, id)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, p.WaitCaughtUp(wctx))

	var page runs.RunList
	res := b.get(t, "/v1/runs?limit=2")
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.NoError(t, json.Unmarshal(res.body, &page))
	require.Len(t, page.Runs, 2)
	require.Equal(t, []string{ids[2], ids[1]}, []string{page.Runs[0].RunID, page.Runs[1].RunID}, "newest first")
	require.Equal(t, "succeeded", string(page.Runs[0].Status))
	require.Equal(t, "seq-1", page.Runs[0].Workflow)
	require.NotNil(t, page.Runs[0].EndedAt)
	require.Positive(t, page.Runs[0].Usage.TotalTokens)
	require.NotEmpty(t, page.Next)
	var rest runs.RunList
	require.NoError(t, json.Unmarshal(b.get(t, "/v1/runs?limit=2&before="+page.Next).body, &rest))
	require.Len(t, rest.Runs, 1)
	require.Equal(t, ids[0], rest.Runs[0].RunID)
	require.Empty(t, rest.Next)

	var all runs.RunList
	require.NoError(t, json.Unmarshal(b.get(t, "/v1/runs?status=succeeded").body, &all))
	require.Len(t, all.Runs, 3)
	require.NoError(t, json.Unmarshal(b.get(t, "/v1/runs?status=failed").body, &all))
	require.Empty(t, all.Runs)
	require.NotNil(t, all.Runs, `an empty listing is "runs": []`)

	for q, field := range map[string]string{"status=done": "status", "limit=0": "limit", "limit=1001": "limit",
		"limit=x": "limit", "before=zzz": "before", "sort=asc": "sort", "limit=1&limit=2": "limit"} {
		m := requireError(t, b.get(t, "/v1/runs?"+q), 400, "bad_input")
		require.Equal(t, field, m["field"], q)
	}
}

// TestListRunsRefusesBadText: a filter or cursor Postgres would refuse as
// text (a NUL byte, invalid UTF-8) is the caller's mistake: 400 bad_input
// naming the parameter, not a 503 of the projection, and nothing is logged
// as a failure.
func TestListRunsRefusesBadText(t *testing.T) {
	t.Parallel()
	pool := migratedPool(t)
	logs := paltest.NewLogCapture()
	b := setup(t, withRuns(projections.NewReader(pool)), withHandler(func(hc *api.HandlerConfig) {
		hc.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}))
	cursor := func(raw string) string { return base64.RawURLEncoding.EncodeToString([]byte(raw)) }
	for _, tc := range []struct{ query, field string }{
		{"workflow=%00", "workflow"}, {"workflow=a%00b", "workflow"}, {"workflow=%ff", "workflow"}, {"workflow=%c3", "workflow"},
		{"status=%00", "status"}, {"limit=%ff", "limit"}, {"before=%00", "before"},
		{"before=" + cursor("1|\x00"), "before"}, {"before=" + cursor("1|\xff"), "before"}, {"before=" + cursor("1|run_a\x00"), "before"},
		{"before=" + cursor("1|"), "before"}, {"before=" + cursor("x|run_a"), "before"}, {"before=" + cursor("1 |run_a"), "before"},
		{"before=" + cursor("-9223372036854775808|run_a"), "before"}, {"before=" + cursor("9223372036854775807|run_a"), "before"},
	} {
		m := requireError(t, b.get(t, "/v1/runs?"+tc.query), http.StatusBadRequest, "bad_input")
		require.Equal(t, tc.field, m["field"], tc.query)
	}
	require.NotContains(t, logs.String(), "level=WARN", "a bad filter is no failure of the server")
	// A good filter and cursor still reach Postgres.
	res := b.get(t, "/v1/runs?workflow=caf%C3%A9&before="+cursor("1733000000000000|run_a"))
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.JSONEq(t, `{"runs":[]}`, string(res.body))
}

func TestApprove(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	wf := `{"name":"gate","nodes":[{"id":"start","type":"trigger"},
		{"id":"ok","type":"approval","data":{"prompt":"Ship it?","approvers":["ci","ann"]}},
		{"id":"done","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"done"}]}`
	start := func() string {
		res := b.post(t, "/v1/runs", `{"workflow":`+wf+`}`)
		require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
		id := res.json(t)["run_id"].(string)
		b.WaitFor(t, id, "the approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
		return id
	}

	id := start()
	require.Equal(t, "waiting", b.get(t, "/v1/runs/"+id).json(t)["status"])
	before := b.journalState(t)
	// An admin token may name an approver, but not one the step refuses.
	m := requireError(t, b.post(t, "/v1/runs/"+id+"/approve", `{"step_id":"ok","decision":"approve","approver":"bob"}`, bearerOf(adminToken)...), 400, "bad_input")
	require.Equal(t, "approver", m["field"])
	require.Equal(t, before, b.journalState(t))
	// No approver in the body: the token's name decides.
	res := b.post(t, "/v1/runs/"+id+"/approve", `{"step_id":"ok","decision":"approve","comment":"looks good"}`)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, map[string]any{"ok": true, "run_id": id}, res.json(t))
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	got := b.WaitFor(t, id, "the decision", func(ev event.Event) bool { return ev.Kind == event.ApprovalReceived })
	require.Equal(t, "ci", got.WorkerID)
	n := len(b.Events(t, id))
	requireError(t, b.post(t, "/v1/runs/"+id+"/approve", `{"step_id":"ok","decision":"reject"}`), 409, "conflict")
	require.Len(t, b.Events(t, id), n)

	// A rejection fails the run (no edge routes on it).
	id = start()
	res = b.post(t, "/v1/runs/"+id+"/approve", fmt.Sprintf(`{"run_id":%q,"step_id":"ok","decision":"reject","approver":"ann"}`, id), bearerOf(adminToken)...)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, id).Kind)
}

func TestStartPlainLLMRun(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	res := b.post(t, "/v1/runs", `{"llm":{"provider":"openai","model":"gpt-4o-mini","prompt":"hello {{input.who}}"},"input":{"who":"pal"}}`)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	runID := res.json(t)["run_id"].(string)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	got := b.get(t, "/v1/runs/"+runID).json(t)
	require.Equal(t, "succeeded", got["status"])
	require.Equal(t, "llm", got["workflow"])
	requireError(t, b.post(t, "/v1/runs", `{"llm":{"provider":"openai","model":"m","prompt":"x"},"workflow":`+echoWorkflow+`}`), 400, "bad_input")
	requireError(t, b.post(t, "/v1/runs", `{"llm":{"provider":"openai","model":"m","prompt":"x","bogus":1}}`), 400, "bad_input")
}
