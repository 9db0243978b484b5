package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
)

func TestNATSService(t *testing.T) {
	t.Parallel()
	pal := paltest.New(t, paltest.LeaseTTL(0))
	nc := pal.NC
	ctx := context.Background()
	svc, err := api.StartService(ctx, nc, pal.Runs, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })

	// Discovery, as nats micro ls does it.
	info, err := nc.Request("$SRV.INFO.pal", nil, 5*time.Second)
	require.NoError(t, err)
	var si micro.Info
	require.NoError(t, json.Unmarshal(info.Data, &si))
	require.Equal(t, "pal", si.Name)
	var subjects []string
	for _, ep := range si.Endpoints {
		subjects = append(subjects, ep.Subject)
	}
	require.ElementsMatch(t, []string{"pal.api.runs.start", "pal.api.runs.get", "pal.api.runs.approve", "pal.api.runs.cancel", "pal.api.runs.budget",
		"pal.api.runs.signal", "pal.api.runs.resume", "pal.api.runs.fork", "pal.api.runs.retry",
		eventstore.WorkflowDeploySubject, "pal.api.workflows.get", "pal.api.workflows.list",
		"pal.api.schedules.create", "pal.api.schedules.get", "pal.api.schedules.list", "pal.api.schedules.pause",
		"pal.api.schedules.resume", "pal.api.schedules.delete", "pal.api.schedules.trigger",
		"pal.guard.CONSUMER.CREATE.>"}, subjects, "the runs', workflows' and schedules' endpoints, and the guard of the client account's consumer creates")

	req := func(subject, body string) (map[string]any, *nats.Msg) {
		t.Helper()
		m, err := nc.Request(subject, []byte(body), 10*time.Second)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(m.Data, &out), string(m.Data))
		return out, m
	}
	wf := `{"name":"one","nodes":[{"id":"start","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"a"}]}`
	// A start over NATS names a deployed workflow; pal.api.workflows.deploy
	// (which only the deploying roles may request) deploys it.
	out, m := req(eventstore.WorkflowDeploySubject, wf)
	require.Empty(t, m.Header.Get(micro.ErrorHeader), out)
	require.Equal(t, map[string]any{"name": "one", "version": float64(1), "sha256": out["sha256"]}, out)
	out, _ = req("pal.api.workflows.get", `{"name":"one"}`)
	got, err := json.Marshal(out["workflow"])
	require.NoError(t, err)
	require.JSONEq(t, wf, string(got))
	require.Equal(t, float64(1), out["latest"])
	out, _ = req("pal.api.workflows.list", ``)
	require.Len(t, out["workflows"], 1)
	out, m = req("pal.api.runs.start", `{"workflow":"one@1","input":{"x":1},"idempotency_key":"k1"}`)
	require.Empty(t, m.Header.Get(micro.ErrorHeader))
	runID, _ := out["run_id"].(string)
	require.Equal(t, runs.RunIDForKey("k1"), runID)
	require.Equal(t, true, out["created"])
	out, _ = req("pal.api.runs.start", `{"workflow":"one","input":{"x":1},"idempotency_key":"k1"}`)
	require.Equal(t, runID, out["run_id"])
	require.Equal(t, false, out["created"], "the same key creates one run")

	out, _ = req("pal.api.runs.get", fmt.Sprintf(`{"run_id":%q}`, runID))
	require.Equal(t, "queued", out["status"])

	for _, tc := range []struct{ subject, body, code, status string }{
		{"pal.api.runs.start", `{"workflow":`, "bad_input", "400"},
		{"pal.api.runs.start", `{"workflow":{"name":"x"},"bogus":true}`, "bad_input", "400"},
		{"pal.api.runs.get", `{"run_id":"nope"}`, "not_found", "404"},
		{"pal.api.runs.get", `{"run_id":"a>"}`, "bad_input", "400"},
		{"pal.api.runs.approve", fmt.Sprintf(`{"run_id":%q,"step_id":"a","decision":"approve","approver":"x"}`, runID), "conflict", "409"},
		{"pal.api.runs.cancel", `{"run_id":"missing"}`, "not_found", "404"},
		{"pal.api.runs.budget", fmt.Sprintf(`{"run_id":%q,"add_usd":1}`, runID), "bad_input", "400"}, // it has no budget
		{"pal.api.runs.budget", `{"run_id":"missing","add_usd":1}`, "not_found", "404"},
		{"pal.api.runs.start", `{"workflow":"one","budget":{"maxCostUsd":-1}}`, "bad_input", "400"},
		{"pal.api.runs.start", `{"workflow":"two"}`, "not_found", "404"},
		{"pal.api.workflows.get", `{"name":"one","version":2}`, "not_found", "404"},
		{"pal.api.workflows.get", `{"name":"a.b"}`, "bad_input", "400"},
		{"pal.api.workflows.list", `{"x":1}`, "bad_input", "400"},
		{eventstore.WorkflowDeploySubject, `{"name":"bad name","nodes":[{"id":"start","type":"trigger"}]}`, "bad_input", "400"},
	} {
		out, m := req(tc.subject, tc.body)
		require.Equal(t, tc.code, out["code"], tc.body)
		require.NotEmpty(t, out["error"], tc.body)
		require.Equal(t, tc.status, m.Header.Get(micro.ErrorCodeHeader), tc.body)
	}
	out, _ = req("pal.api.runs.cancel", fmt.Sprintf(`{"run_id":%q,"reason":"test"}`, runID))
	require.Equal(t, true, out["ok"])
	out, _ = req("pal.api.runs.get", fmt.Sprintf(`{"run_id":%q}`, runID))
	require.Equal(t, "cancelled", out["status"])
}
