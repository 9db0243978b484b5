package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
	palv1 "github.com/palrun/pal/proto/pal/v1"
)

// TestRemovedJournalOnEveryPath: a run whose journal retention removed
// reads from its rows the same on REST GET /v1/runs/{id}, gRPC GetRun and
// pal.api.runs.get; its event feed answers REST's 410 journal_removed and
// gRPC's code for it, FAILED_PRECONDITION (answerCodes).
func TestRemovedJournalOnEveryPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t).Pool(t)
	_, err := projections.Migrate(ctx, pool)
	require.NoError(t, err)
	reader := projections.NewReader(pool)
	b := setup(t, withWorker(), withRuns(reader))
	p := projections.New(pool, b.Store, projections.Config{Logger: paltest.Logger(t), Retention: projections.MinRetention})
	b.Serve(t, "the projector", p)
	svc, err := api.StartService(ctx, b.NC, b.Runs, paltest.Logger(t), api.WithRunReader(reader))
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })

	old := b.Start(t, echoWorkflow, `{"v":"old"}`)
	b.WaitEnd(t, old)
	// A later run, so the old run's last message is not the stream's last
	// (which retention never purges).
	b.WaitEnd(t, b.Start(t, echoWorkflow, `{"v":"later"}`))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, p.WaitCaughtUp(wctx))
	_, err = pool.Exec(ctx, "UPDATE runs SET ended_at = now() - interval '2 hours' WHERE run_id = $1", old)
	require.NoError(t, err)
	n, err := p.RemoveExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, _, err = b.Store.Read(ctx, old)
	require.ErrorIs(t, err, eventstore.ErrRunNotFound, "the journal is gone")

	rest := b.get(t, "/v1/runs/"+old)
	require.Equal(t, http.StatusOK, rest.status, "body: %s", rest.body)
	require.NotEmpty(t, rest.json(t)["journal_removed_at"])

	client := b.grpcClient(t)
	gctx, gcancel := context.WithTimeout(withBearer(ctx, testToken), 30*time.Second)
	defer gcancel()
	run, err := client.GetRun(gctx, &palv1.GetRunRequest{RunId: old})
	require.NoError(t, err)
	require.Equal(t, "succeeded", run.Status)
	require.Equal(t, string(rest.body), string(run.View)+"\n", "GetRun's view is the same bytes as REST's body")

	m, err := b.NC.Request("pal.api.runs.get", fmt.Appendf(nil, `{"run_id":%q}`, old), 10*time.Second)
	require.NoError(t, err)
	require.Empty(t, m.Header.Get(micro.ErrorHeader), "%s", m.Data)
	require.JSONEq(t, string(rest.body), string(m.Data))

	requireError(t, b.get(t, "/v1/runs/"+old+"/events"), http.StatusGone, "journal_removed")
	stream, err := client.StreamRunEvents(gctx, &palv1.StreamRunEventsRequest{RunId: old})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "removed by retention")

	// A run that never was is still not found on every path.
	_, err = client.GetRun(gctx, &palv1.GetRunRequest{RunId: "run_never_was"})
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	m, err = b.NC.Request("pal.api.runs.get", []byte(`{"run_id":"run_never_was"}`), 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "404", m.Header.Get(micro.ErrorCodeHeader))
	var ans map[string]any
	require.NoError(t, json.Unmarshal(m.Data, &ans))
	require.Equal(t, "not_found", ans["code"])
}
