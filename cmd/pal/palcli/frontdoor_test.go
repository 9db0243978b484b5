package palcli_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/runs"
)

// TestOneFrontDoor: a fork or retry made with pal run journals in its
// run_created the anomaly rules of PAL_ANOMALY_* exactly as the same
// command over REST and over the NATS service (pal server, with the same
// settings) does: every door builds the same runs.Client.
func TestOneFrontDoor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	settings := []string{"PAL_ANOMALY_RUNAWAY_LOOP=threshold=3,action=pause", "PAL_ANOMALY_RETRY_STORM=threshold=7"}
	port := testenv.FreePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := testenv.StartProcess(t, b.bin, []string{"server"}, append([]string{"PAL_NATS_URL=" + b.NATS.URL(),
		fmt.Sprintf("PAL_HTTP_ADDR=127.0.0.1:%d", port), "PAL_API_TOKENS=ci=secret-1"}, settings...))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, srv.WaitForOutput(ctx, `msg="server ready"`), srv.Output())
	rest := func(path, body string) string {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer secret-1")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		out, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.StatusCode, "%s", out)
		return decodeJSON[map[string]any](t, string(out))["run_id"].(string)
	}
	service := func(kind, body string) string {
		t.Helper()
		m, err := b.NC.Request("pal.api.runs."+kind, []byte(body), 30*time.Second)
		require.NoError(t, err)
		a := decodeJSON[runs.Answer](t, string(m.Data))
		require.True(t, a.OK, "%s", m.Data)
		return a.RunID
	}
	anomalies := func(runID string) map[string]event.AnomalyRule {
		t.Helper()
		evs := b.Events(t, runID)
		require.Equal(t, event.RunCreated, evs[0].Kind)
		var d event.RunCreatedData
		require.NoError(t, evs[0].DecodeData(&d))
		require.NotNil(t, d.ForkedFrom, "run %s is a fork", runID)
		return d.Anomalies
	}

	done := b.start(t, seqWorkflow(2), `{"text":"forked"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, done).Kind)
	failed := b.start(t, seqWorkflow(2), `{"text":"FAIL"}`)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, failed).Kind)
	for _, tc := range []struct {
		name string
		cli  []string
		path string
		body string
		nats string
	}{
		{"fork", []string{"run", "fork", done, "--from", "s2"}, "/v1/runs/" + done + "/fork", `{"from":"s2"}`, `{"run_id":"` + done + `","from":"s2"}`},
		{"retry", []string{"run", "retry", failed}, "/v1/runs/" + failed + "/retry", ``, `{"run_id":"` + failed + `"}`},
	} {
		r := b.pal(t, settings, tc.cli...)
		require.Equal(t, 0, r.code, "%s: %s", tc.name, r)
		viaCLI := strings.TrimSpace(r.stdout)
		viaREST := rest(tc.path, tc.body)
		viaNATS := service(tc.name, tc.nats)

		got := anomalies(viaCLI)
		require.Equal(t, anomalies(viaREST), got, "%s: pal run %s and REST journal other rules", tc.name, tc.name)
		require.Equal(t, anomalies(viaNATS), got, "%s: pal run %s and the NATS service journal other rules", tc.name, tc.name)
		require.Equal(t, event.AnomalyRule{Threshold: 3, Requests: 10, Action: event.ActionPause}, got[event.AnomalyRunawayLoop],
			"%s: PAL_ANOMALY_RUNAWAY_LOOP over the built-in rule", tc.name)
		require.Equal(t, 7.0, got[event.AnomalyRetryStorm].Threshold, tc.name)
		for _, id := range []string{viaCLI, viaREST, viaNATS} {
			b.WaitEnd(t, id)
		}
	}
	require.NoError(t, srv.Term())
	require.NoError(t, srv.Wait(ctx), srv.Output())
}
