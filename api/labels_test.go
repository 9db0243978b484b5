package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/runs"
)

// Labels go from a start, over REST and over the NATS service, through
// run_created and the projection to GET /v1/runs?label=, and every other
// filter of the listing reaches Postgres from its query parameter.
func TestListRunsByLabel(t *testing.T) {
	t.Parallel()
	pool := migratedPool(t)
	ctx := context.Background()
	b := setup(t, withWorker(), withRuns(projections.NewReader(pool)))
	p := b.project(t, pool)
	svc, err := api.StartService(ctx, b.NC, b.Runs, paltest.Logger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })

	before := time.Now().UTC()
	var ids []string
	// The first two succeed; the others fail, their input lacking the
	// topic their prompt names.
	for i, labels := range []string{`{"customer":"acme","env":"prod"}`, `{"customer":"acme","env":"dev"}`, `{"customer":"globex"}`} {
		input := map[bool]string{true: `{"topic":"t"}`, false: `{}`}[i < 2]
		res := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":%s,"input":%s,"labels":%s}`, seqWorkflow(1), input, labels))
		require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
		ids = append(ids, res.json(t)["run_id"].(string))
	}
	m, err := b.NC.Request("pal.api.runs.start", []byte(`{"workflow":"seq-1","labels":{"customer":"acme","via":"nats"}}`), 10*time.Second)
	require.NoError(t, err)
	var started struct {
		RunID string `json:"run_id"`
	}
	require.NoError(t, json.Unmarshal(m.Data, &started), string(m.Data))
	require.NotEmpty(t, started.RunID, string(m.Data))
	ids = append(ids, started.RunID)
	for _, id := range ids {
		b.WaitEnd(t, id)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, p.WaitCaughtUp(wctx))

	list := func(query string) []string {
		t.Helper()
		res := b.get(t, "/v1/runs?"+query)
		require.Equal(t, http.StatusOK, res.status, "%s: %s", query, res.body)
		var l runs.RunList
		require.NoError(t, json.Unmarshal(res.body, &l))
		out := []string{}
		for _, r := range l.Runs {
			out = append(out, r.RunID)
		}
		return out
	}
	require.Equal(t, []string{ids[3], ids[1], ids[0]}, list("label=customer=acme"))
	require.Equal(t, []string{ids[0]}, list("label=customer=acme&label=env=prod"))
	require.Equal(t, []string{ids[3]}, list("label="+url.QueryEscape("via=nats")), "the NATS service's start")
	require.Empty(t, list("label=customer=initech"))

	// The listing and the run show the labels.
	res := b.get(t, "/v1/runs?label=env=prod")
	require.Contains(t, string(res.body), `"labels":{"customer":"acme","env":"prod"}`)
	res = b.get(t, "/v1/runs/"+ids[2])
	require.Equal(t, http.StatusOK, res.status)
	var v runs.RunView
	require.NoError(t, json.Unmarshal(res.body, &v))
	require.Equal(t, map[string]string{"customer": "globex"}, v.Labels)

	// The other filters, each from its parameter.
	t0, t1 := url.QueryEscape(before.Add(-time.Minute).Format(time.RFC3339Nano)), url.QueryEscape(time.Now().Add(time.Minute).Format(time.RFC3339Nano))
	all := []string{ids[3], ids[2], ids[1], ids[0]}
	failed := []string{ids[3], ids[2]}
	require.Equal(t, []string{ids[1], ids[0]}, list("status=succeeded"))
	require.Equal(t, failed, list("status=failed"))
	require.Equal(t, all, list("workflow=seq-1"))
	require.Empty(t, list("workflow=other"))
	require.Equal(t, all, list("since="+t0+"&until="+t1))
	require.Empty(t, list("since="+t1))
	require.Empty(t, list("until="+t0))
	require.Equal(t, failed, list("error_code=step_failed"))
	require.Empty(t, list("error_code=budget_exceeded"))
	require.Equal(t, failed, list("q=HAS+NO+FIELD"))
	require.Equal(t, failed, list("q="+url.QueryEscape("{{input.topic}}")))
	require.Empty(t, list("q=no_field"), "_ matches only itself")
	require.Equal(t, []string{ids[3]}, list("label=customer=acme&status=failed&error_code=step_failed&q=topic&since="+t0))
	require.Equal(t, []string{ids[3]}, list("label=customer=acme&limit=1"))
}

// Every bad value of a listing's parameters is 400 bad_input naming the
// parameter, and a start with bad labels is 400 naming labels with
// nothing written.
func TestBadLabelsAndFilters(t *testing.T) {
	t.Parallel()
	pool := migratedPool(t)
	b := setup(t, withRuns(projections.NewReader(pool)))
	var many []string
	for i := range event.MaxLabels + 1 {
		many = append(many, fmt.Sprintf("label=k%d=v", i))
	}
	for q, field := range map[string]string{
		"label=customer":                      "label",
		"label=Customer=acme":                 "label",
		"label==acme":                         "label",
		"label=k=" + strings.Repeat("x", 257): "label",
		"label=k=a%01b":                       "label",
		"label=k=a&label=k=b":                 "label",
		strings.Join(many, "&"):               "label",
		"label=k=%ff":                         "label",
		"since=yesterday":                     "since",
		"until=2026-13-01T00:00:00Z":          "until",
		"since=2026-03-01":                    "since",
		"since=2026-03-02T00:00:00Z&until=2026-03-01T00:00:00Z": "until",
		"since=2026-03-01T00:00:00Z&since=2026-03-02T00:00:00Z": "since",
		"error_code=Step+Failed":                                "error_code",
		"error_code=" + strings.Repeat("e", 65):                 "error_code",
		"q=":                                                    "q",
		"q=" + strings.Repeat("x", runs.MaxSearchBytes+1):       "q",
		"q=a%00":     "q",
		"order=cost": "order",
	} {
		m := requireError(t, b.get(t, "/v1/runs?"+q), http.StatusBadRequest, "bad_input")
		require.Equal(t, field, m["field"], q)
	}

	before := b.journalState(t)
	for _, labels := range []string{`{"Customer":"acme"}`, `{"k":1}`, `{"k":{"nested":"v"}}`, `["a=b"]`, `{"k":null}`,
		`{"k":"` + strings.Repeat("x", event.MaxLabelValueBytes+1) + `"}`, `{` + manyLabels() + `}`} {
		res := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":%s,"labels":%s}`, seqWorkflow(1), labels))
		m := requireError(t, res, http.StatusBadRequest, "bad_input")
		require.True(t, strings.HasPrefix(m["field"].(string), "labels"), "%s: %v", labels, m)
	}
	require.Equal(t, before, b.journalState(t), "nothing written")
}

// manyLabels is one label over the limit, as JSON members.
func manyLabels() string {
	var ms []string
	for i := range event.MaxLabels + 1 {
		ms = append(ms, fmt.Sprintf(`"k%d":"v"`, i))
	}
	return strings.Join(ms, ",")
}
