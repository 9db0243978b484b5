package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
)

// echoFlow is the workflow the schedules of these tests start.
const echoFlow = `{"name":"echo-flow","nodes":[{"id":"start","type":"trigger"},{"id":"e","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"e"}]}`

// TestScheduleRoutes: /v1/schedules over REST. A token with scope deploy
// creates, pauses, resumes and deletes; one with start triggers; one with
// read only reads. Bad input is 400 naming the field, an unknown
// workflow 404, a taken name 409, and nothing refused is stored; a
// trigger's run carries the schedule and its tick.
func TestScheduleRoutes(t *testing.T) {
	t.Parallel()
	const reader, starter, deployer = "reader-token-0123456789", "starter-token-0123456789", "deployer-token-0123456789"
	b := setup(t, withWorker(), withTokens([]api.Token{
		{Name: "reader", Secret: reader, Scopes: api.ScopeRead},
		{Name: "starter", Secret: starter, Scopes: api.ScopeStart | api.ScopeRead},
		{Name: "deployer", Secret: deployer, Scopes: api.ScopeDeploy | api.ScopeRead}}, false))
	res := b.do(t, http.MethodPut, "/v1/workflows/echo-flow", strings.NewReader(echoFlow), bearerOf(deployer)...)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)

	huge := `"` + strings.Repeat("a", 70<<10) + `"`
	for _, tc := range []struct {
		body, field string
		status      int
	}{
		{`{"name":"s","cron":"0 25 * * *","workflow":"echo-flow"}`, "cron", 400},
		{`{"name":"s","cron":"0 3 * * *","tz":"Nowhere/City","workflow":"echo-flow"}`, "tz", 400},
		{`{"name":"s","every":"0.5s","workflow":"echo-flow"}`, "every", 400},
		{`{"name":"s","every":"2s","cron":"@daily","workflow":"echo-flow"}`, "every", 400},
		{`{"name":"s","workflow":"echo-flow"}`, "cron", 400},
		{`{"name":"s","every":"2s","workflow":"echo-flow","overlap":"queue"}`, "overlap", 400},
		{`{"name":"s","every":"2s","workflow":"echo-flow","catchup":"many"}`, "catchup", 400},
		{`{"name":"s","every":"2s","workflow":"echo-flow","input":` + huge + `}`, "input", 400},
		{`{"name":"a b","every":"2s","workflow":"echo-flow"}`, "name", 400},
		{`{"name":"s","every":"2s","workflow":"echo-flow","extra":1}`, "extra", 400},
		{`{"name":"s","every":"2s","workflow":"no-such-flow"}`, "", 404},
	} {
		res := b.post(t, "/v1/schedules", tc.body, bearerOf(deployer)...)
		code := map[int]string{400: "bad_input", 404: "not_found"}[tc.status]
		m := requireError(t, res, tc.status, code)
		if tc.field != "" {
			require.Equal(t, tc.field, m["field"], tc.body)
		}
	}
	m := requireError(t, b.post(t, "/v1/schedules", `{"name":"s","every":"2s","workflow":"echo-flow"}`, bearerOf(starter)...), http.StatusForbidden, "forbidden")
	require.Contains(t, m["detail"], "lacks scope deploy")
	res = b.get(t, "/v1/schedules", bearerOf(reader)...)
	require.Equal(t, http.StatusOK, res.status)
	require.Equal(t, `{"schedules":[]}`, strings.TrimSpace(string(res.body)), "nothing refused was stored")

	res = b.post(t, "/v1/schedules", `{"name":"hourly","cron":"@hourly","workflow":"echo-flow","input":{"k":1}}`, bearerOf(deployer)...)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	require.Equal(t, "/v1/schedules/hourly", res.header.Get("Location"))
	var v runs.ScheduleView
	require.NoError(t, json.Unmarshal(res.body, &v))
	require.Equal(t, "deployer", v.By)
	require.Equal(t, 0, v.Next.Minute())
	require.True(t, v.Next.After(time.Now()))
	requireError(t, b.post(t, "/v1/schedules", `{"name":"hourly","every":"2s","workflow":"echo-flow"}`, bearerOf(deployer)...), http.StatusConflict, "conflict")

	requireError(t, b.post(t, "/v1/schedules/hourly/pause", ``, bearerOf(starter)...), http.StatusForbidden, "forbidden")
	res = b.post(t, "/v1/schedules/hourly/pause", ``, bearerOf(deployer)...)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	res = b.get(t, "/v1/schedules/hourly", bearerOf(reader)...)
	require.Equal(t, http.StatusOK, res.status)
	require.Equal(t, true, res.json(t)["paused"])
	require.Nil(t, res.json(t)["next"], "a paused schedule has no next tick")
	res = b.post(t, "/v1/schedules/hourly/resume", ``, bearerOf(deployer)...)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	require.Nil(t, res.json(t)["paused"])

	requireError(t, b.post(t, "/v1/schedules/hourly/trigger", ``, bearerOf(reader)...), http.StatusForbidden, "forbidden")
	res = b.post(t, "/v1/schedules/hourly/trigger", ``, bearerOf(starter)...)
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	var tr runs.TriggerResult
	require.NoError(t, json.Unmarshal(res.body, &tr))
	require.Equal(t, event.ScheduleRunID("hourly", tr.Tick), tr.RunID)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, tr.RunID).Kind)
	var c event.RunCreatedData
	require.NoError(t, b.Events(t, tr.RunID)[0].DecodeData(&c))
	require.Equal(t, "hourly", c.Schedule)
	require.Equal(t, event.FormatTick(tr.Tick), c.Tick)
	require.JSONEq(t, `{"k":1}`, string(c.Input))
	require.Equal(t, "starter", b.Events(t, tr.RunID)[0].WorkerID, "the trigger's caller started it")
	res = b.get(t, "/v1/runs/"+tr.RunID, bearerOf(reader)...)
	require.Equal(t, "hourly", res.json(t)["schedule"])
	res = b.get(t, "/v1/schedules/hourly", bearerOf(reader)...)
	require.Equal(t, tr.RunID, res.json(t)["last_run"])

	requireError(t, b.do(t, http.MethodDelete, "/v1/schedules/hourly", nil, bearerOf(starter)...), http.StatusForbidden, "forbidden")
	res = b.do(t, http.MethodDelete, "/v1/schedules/hourly", nil, bearerOf(deployer)...)
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
	for _, p := range []string{"/v1/schedules/hourly", "/v1/schedules/a.b"} {
		requireError(t, b.get(t, p, bearerOf(reader)...), http.StatusNotFound, "not_found")
	}
	requireError(t, b.post(t, "/v1/schedules/hourly/trigger", ``, bearerOf(starter)...), http.StatusNotFound, "not_found")
}

// TestScheduleService: pal.api.schedules.* on the NATS service, as PAL's
// own account: create, get, list, pause, resume, trigger, delete; bad
// input answered 400 naming the field, an unknown schedule 404.
func TestScheduleService(t *testing.T) {
	t.Parallel()
	pal := paltest.New(t, paltest.LeaseTTL(0))
	nc := pal.NC
	svc, err := api.StartService(context.Background(), nc, pal.Runs, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })
	pal.Deploy(t, echoFlow)
	req := func(subject, body string) (map[string]any, *nats.Msg) {
		t.Helper()
		m, err := nc.Request(subject, []byte(body), 10*time.Second)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(m.Data, &out), string(m.Data))
		return out, m
	}
	for _, tc := range []struct{ subject, body, code, status, field string }{
		{"pal.api.schedules.create", `{"name":"n","cron":"* * *","workflow":"echo-flow"}`, "bad_input", "400", "cron"},
		{"pal.api.schedules.create", `{"name":"n","every":"2s","workflow":"echo-flow","catchup":"x"}`, "bad_input", "400", "catchup"},
		{"pal.api.schedules.create", `{"name":"n","every":"2s","workflow":"nope"}`, "not_found", "404", ""},
		{"pal.api.schedules.get", `{}`, "bad_input", "400", "name"},
		{"pal.api.schedules.get", `{"name":"none"}`, "not_found", "404", ""},
		{"pal.api.schedules.trigger", `{"name":"none"}`, "not_found", "404", ""},
		{"pal.api.schedules.list", `{"x":1}`, "bad_input", "400", ""},
	} {
		out, m := req(tc.subject, tc.body)
		require.Equal(t, tc.code, out["code"], "%s %s", tc.subject, tc.body)
		require.Equal(t, tc.status, m.Header.Get(micro.ErrorCodeHeader))
		if tc.field != "" {
			require.Equal(t, tc.field, out["field"])
		}
	}
	out, m := req("pal.api.schedules.create", `{"name":"n","every":"1h","workflow":"echo-flow"}`)
	require.Empty(t, m.Header.Get(micro.ErrorHeader), out)
	require.Equal(t, "1h", out["every"])
	out, _ = req("pal.api.schedules.list", ``)
	require.Len(t, out["schedules"], 1)
	out, _ = req("pal.api.schedules.pause", `{"name":"n"}`)
	require.Equal(t, true, out["paused"])
	out, _ = req("pal.api.schedules.resume", `{"name":"n"}`)
	require.Nil(t, out["paused"])
	out, m = req("pal.api.schedules.trigger", `{"name":"n"}`)
	require.Empty(t, m.Header.Get(micro.ErrorHeader), out)
	runID := out["run_id"].(string)
	var c event.RunCreatedData
	require.NoError(t, pal.Events(t, runID)[0].DecodeData(&c))
	require.Equal(t, "n", c.Schedule)
	out, _ = req("pal.api.schedules.get", `{"name":"n"}`)
	require.Equal(t, runID, out["last_run"])
	out, _ = req("pal.api.schedules.delete", `{"name":"n"}`)
	require.Equal(t, "n", out["deleted"])
	out, _ = req("pal.api.schedules.list", `{}`)
	require.Empty(t, out["schedules"])
}
