package api_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
)

// TestMetricsNeedScopeRead: GET /metrics answers 401 without a token,
// 403 to a token without scope read, and the metrics to one with it.
// Not parallel: it counts deltas of the test binary's one registry, so
// no other test may run meanwhile.
func TestMetricsNeedScopeRead(t *testing.T) {
	b := setup(t, withWorker(), withTokens([]api.Token{{Name: "ci", Secret: testToken},
		{Name: "starter", Secret: "start-only-0123456789", Scopes: api.ScopeStart}}, false))
	requireError(t, b.get(t, "/metrics", "Authorization", ""), http.StatusUnauthorized, "unauthorized")
	requireError(t, b.get(t, "/metrics", bearerOf("start-only-0123456789")...), http.StatusForbidden, "forbidden")

	auth := http.Header{"Authorization": {"Bearer " + testToken}}
	before := testenv.Scrape(t, b.url+"/metrics", auth)
	value := func(m testenv.Metrics, name string, labels ...string) float64 {
		v, _ := m.Value(name, labels...)
		return v
	}
	// A run through the API, to its end, and a refused cancel.
	r := b.post(t, "/v1/runs", `{"workflow":`+seqWorkflow(2)+`,"input":{"topic":"m"}}`, bearerOf(testToken)...)
	require.Equal(t, http.StatusCreated, r.status, string(r.body))
	runID := r.json(t)["run_id"].(string)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	requireError(t, b.post(t, "/v1/runs/run_nope/cancel", "", bearerOf(testToken)...), http.StatusNotFound, "not_found")

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		after := testenv.Scrape(t, b.url+"/metrics", auth)
		for _, s := range []struct {
			name   string
			labels []string
			delta  float64
		}{
			{"pal_runs_started_total", nil, 1},
			{"pal_runs_finished_total", []string{"status=succeeded"}, 1},
			{"pal_steps_total", []string{"node_type=ai-step", "outcome=completed"}, 2},
			{"pal_drives_total", []string{"outcome=done"}, 1},
			{"pal_provider_calls_total", []string{"provider=openai", "model=gpt-4o-mini", "result=ok"}, 2},
			{"pal_commands_refused_total", []string{"command=cancel", "reason=not_found"}, 1},
		} {
			assert.Equal(c, s.delta, value(after, s.name, s.labels...)-value(before, s.name, s.labels...), "%s%v", s.name, s.labels)
		}
	}, 30*time.Second, 20*time.Millisecond)
}

// TestMetricsOpen: with MetricsOpen (PAL_METRICS_OPEN=1) /metrics needs
// no token, and the /v1 routes still do.
func TestMetricsOpen(t *testing.T) {
	t.Parallel()
	st := paltest.New(t)
	srv := api.NewServer("127.0.0.1:0", api.NewHandler(api.HandlerConfig{Store: st.Store, Tokens: []api.Token{{Name: "ci", Secret: testToken}},
		MetricsOpen: true, Logger: paltest.Logger(t)}), paltest.Logger(t))
	st.Serve(t, "the REST API", srv)
	m := testenv.Scrape(t, srv.URL()+"/metrics", nil)
	_, ok := m.Value("pal_runs_started_total")
	require.True(t, ok)
	resp, err := http.Get(srv.URL() + "/v1/runs/run_a")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, "unauthorized", body["error"])
}
