package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
)

// triage is a deployed workflow that holds on an approval, then echoes
// which version of it ran.
func triage(version int) string {
	return fmt.Sprintf(`{"name":"triage","nodes":[{"id":"start","type":"trigger"},
		{"id":"ok","type":"approval","data":{"prompt":"go?"}},
		{"id":"done","type":"tool","data":{"tool":"echo","input":{"version":%d}}}],
		"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"done"}]}`, version)
}

// TestStartOnlyTokenStartsDeployedWorkflows: a token with scope start
// alone starts deployed workflows by name, NAME or NAME@VERSION; a start
// or fork that brings its own definition is refused with 403 naming scope
// deploy, and nothing is written or deployed. A redeploy makes the next
// version, and a run of the earlier one, in flight on its approval,
// finishes on the version it started with.
func TestStartOnlyTokenStartsDeployedWorkflows(t *testing.T) {
	t.Parallel()
	const starter, deployer = "starter-token-0123456789", "deployer-token-0123456789"
	b := setup(t, withWorker(), withTokens([]api.Token{
		{Name: "starter", Secret: starter, Scopes: api.ScopeStart | api.ScopeRead},
		{Name: "deployer", Secret: deployer, Scopes: api.ScopeDeploy},
		{Name: "lead", Secret: adminToken, Scopes: api.ScopeAdmin}}, false))
	put := func(tok, name, body string) response {
		t.Helper()
		return b.do(t, http.MethodPut, "/v1/workflows/"+name, strings.NewReader(body), bearerOf(tok)...)
	}

	res := put(deployer, "triage", triage(1))
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	v1 := res.json(t)
	require.Equal(t, map[string]any{"name": "triage", "version": float64(1), "sha256": v1["sha256"]}, v1)
	require.Equal(t, "/v1/workflows/triage?version=1", res.header.Get("Location"))
	res = put(deployer, "triage", triage(1))
	require.Equal(t, http.StatusOK, res.status, "the same content again: unchanged")
	require.Equal(t, v1, res.json(t))
	requireError(t, put(deployer, "other", triage(1)), http.StatusBadRequest, "bad_input")
	requireError(t, put(starter, "triage", triage(1)), http.StatusForbidden, "forbidden")

	// Refused: an inline definition, before anything is written or deployed.
	before := b.journalState(t)
	m := requireError(t, b.post(t, "/v1/runs", `{"workflow":`+triage(9)+`}`, bearerOf(starter)...), http.StatusForbidden, "forbidden")
	require.Equal(t, "workflow", m["field"])
	require.Contains(t, m["detail"], "token starter lacks scope deploy")
	m = requireError(t, b.post(t, "/v1/runs", `{"llm":{"provider":"openai","model":"gpt-4o-mini","prompt":"hi"}}`, bearerOf(starter)...),
		http.StatusForbidden, "forbidden")
	require.Equal(t, "llm", m["field"])
	require.Equal(t, before, b.journalState(t), "a refused start wrote or deployed something")

	// Started by name: the latest version, and the version named.
	start := func(body string) string {
		t.Helper()
		res := b.post(t, "/v1/runs", body, bearerOf(starter)...)
		require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
		return res.json(t)["run_id"].(string)
	}
	deployed := func(runID string) *event.Deployed {
		t.Helper()
		var d event.RunCreatedData
		require.NoError(t, b.Events(t, runID)[0].DecodeData(&d))
		return d.Deployed
	}
	latest := start(`{"workflow":"triage"}`)
	first := start(`{"workflow":"triage@1"}`)
	for _, id := range []string{latest, first} {
		require.Equal(t, &event.Deployed{Name: "triage", Version: 1, SHA256: v1["sha256"].(string)}, deployed(id))
		b.WaitFor(t, id, "the approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	}
	requireError(t, b.post(t, "/v1/runs", `{"workflow":"triage@2"}`, bearerOf(starter)...), http.StatusNotFound, "not_found")

	// A redeploy makes version 2 while the runs of version 1 wait.
	res = put(deployer, "triage", triage(2))
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	require.Equal(t, float64(2), res.json(t)["version"])
	second := start(`{"workflow":"triage"}`)
	require.Equal(t, uint64(2), deployed(second).Version)
	for _, id := range []string{first, second} {
		b.WaitFor(t, id, "the approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
		res := b.post(t, "/v1/runs/"+id+"/approve", `{"step_id":"ok","decision":"approve"}`, bearerOf(adminToken)...)
		require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	}
	for id, want := range map[string]int{first: 1, second: 2} {
		end := b.WaitEnd(t, id)
		require.Equal(t, event.RunSucceeded, end.Kind)
		var out event.RunSucceededData
		require.NoError(t, end.DecodeData(&out))
		require.JSONEq(t, fmt.Sprintf(`{"version":%d}`, want), string(out.Output), "run %s finished on version %d", id, want)
	}

	// A fork: with the run's own workflow it needs start only; with
	// another, deploy too.
	before = b.journalState(t)
	m = requireError(t, b.post(t, "/v1/runs/"+first+"/fork", `{"from":"done","workflow":`+triage(3)+`}`, bearerOf(starter)...),
		http.StatusForbidden, "forbidden")
	require.Equal(t, "workflow", m["field"])
	require.Contains(t, m["detail"], "token starter lacks scope deploy")
	require.Equal(t, before, b.journalState(t), "a refused fork wrote or deployed something")
	res = b.post(t, "/v1/runs/"+first+"/fork", `{"from":"done"}`, bearerOf(starter)...)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	fork := res.json(t)["run_id"].(string)
	require.Equal(t, uint64(1), deployed(fork).Version, "a fork keeps its source's version")
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, fork).Kind)

	// The registry reads back: the latest version of each, one version
	// with its definition and the list of versions.
	res = b.get(t, "/v1/workflows", bearerOf(starter)...)
	require.Equal(t, http.StatusOK, res.status)
	var list struct {
		Workflows []struct {
			Name    string `json:"name"`
			Version uint64 `json:"version"`
			By      string `json:"by"`
		} `json:"workflows"`
	}
	require.NoError(t, json.Unmarshal(res.body, &list))
	require.Len(t, list.Workflows, 1)
	require.Equal(t, uint64(2), list.Workflows[0].Version)
	require.Equal(t, "deployer", list.Workflows[0].By)
	res = b.get(t, "/v1/workflows/triage?version=1", bearerOf(starter)...)
	require.Equal(t, http.StatusOK, res.status)
	var one struct {
		Version  uint64          `json:"version"`
		Latest   uint64          `json:"latest"`
		Workflow json.RawMessage `json:"workflow"`
		Versions []struct {
			Version uint64 `json:"version"`
		} `json:"versions"`
	}
	require.NoError(t, json.Unmarshal(res.body, &one))
	require.Equal(t, uint64(1), one.Version)
	require.Equal(t, uint64(2), one.Latest)
	require.JSONEq(t, triage(1), string(one.Workflow))
	require.Len(t, one.Versions, 2)
	requireError(t, b.get(t, "/v1/workflows/triage?version=3", bearerOf(starter)...), http.StatusNotFound, "not_found")
	requireError(t, b.get(t, "/v1/workflows/triage?version=x", bearerOf(starter)...), http.StatusBadRequest, "bad_input")
	requireError(t, b.get(t, "/v1/workflows/triage@1", bearerOf(starter)...), http.StatusBadRequest, "bad_input")
}
