package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	palv1 "github.com/palrun/pal/proto/pal/v1"
)

// TestCorruptJournalReadsFailed: a run whose journal holds a message that
// is not a sound continuation answers 200 with the failed view on GET, not
// 503; an approval is refused as for any ended run, and seals the journal.
func TestCorruptJournalReadsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, withoutJournalCheck())
	runID := b.Start(t, `{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{}}],
		"edges":[{"from":"start","to":"ok"}]}`, `{}`)
	_, err := b.JS.Publish(context.Background(), eventstore.EventsSubject(runID), []byte(`{"v":1,"oops"`))
	require.NoError(t, err)

	r := b.get(t, "/v1/runs/"+runID)
	require.Equal(t, 200, r.status, "body: %s", r.body)
	v := r.json(t)
	require.Equal(t, "failed", v["status"])
	require.Equal(t, event.CodeJournalCorrupt, v["error_code"])
	require.Contains(t, v["error"], "the journal is corrupt at seq 2")

	r = b.post(t, "/v1/runs/"+runID+"/approve", `{"step_id":"ok","decision":"approve"}`)
	require.Equal(t, 409, r.status, "body: %s", r.body)
	evs, _, err := b.Store.Read(context.Background(), runID)
	require.NoError(t, err, "the journal is sealed")
	last := evs[len(evs)-1]
	require.Equal(t, event.RunFailed, last.Kind)
	require.Equal(t, uint64(2), last.Seq)

	r = b.get(t, "/v1/runs/"+runID)
	require.Equal(t, 200, r.status)
	require.Equal(t, event.CodeJournalCorrupt, r.json(t)["error_code"])
}

// TestCorruptJournalFeedEnds: the event feed of a corrupt journal that no
// worker has sealed yet sends the sound events and ends as the feed of an
// ended run does (SSE: the stream closes, a reconnect after the last
// sound event is 204; gRPC: the stream ends OK), not 503 or UNAVAILABLE:
// a corrupt journal is over (§6.1.1).
func TestCorruptJournalFeedEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, withoutJournalCheck())
	runID := b.Start(t, `{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{}}],
		"edges":[{"from":"start","to":"ok"}]}`, `{}`)
	sound := b.Events(t, runID)
	_, err := b.JS.Publish(context.Background(), eventstore.EventsSubject(runID), []byte(`{"v":1,"oops"`))
	require.NoError(t, err)
	_, _, err = b.Store.Read(context.Background(), runID)
	require.ErrorIs(t, err, event.ErrJournalCorrupt, "not sealed")

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	s, err := b.openSSE(t, client, runID, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, s.res.StatusCode)
	got := s.readAll(t) // ends: the server closes the stream
	s.close()
	require.Len(t, got, len(sound))
	for i, ev := range got {
		require.Equal(t, sound[i].Seq, ev.id)
		require.Equal(t, string(sound[i].Kind), ev.kind)
	}
	last := strconv.FormatUint(sound[len(sound)-1].Seq, 10)
	r := b.get(t, "/v1/runs/"+runID+"/events", "Last-Event-ID", last)
	require.Equal(t, http.StatusNoContent, r.status, "body: %s", r.body)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, after := range []uint64{0, sound[len(sound)-1].Seq} {
		stream, err := b.grpcClient(t).StreamRunEvents(withBearer(ctx, testToken), &palv1.StreamRunEventsRequest{RunId: runID, AfterSeq: after})
		require.NoError(t, err)
		var seqs []uint64
		for {
			ev, err := stream.Recv()
			if err == io.EOF {
				break
			}
			require.NoError(t, err, "after %d", after)
			seqs = append(seqs, ev.Seq)
		}
		require.Len(t, seqs, len(sound)-int(after))
	}
	_, _, err = b.Store.Read(context.Background(), runID)
	require.ErrorIs(t, err, event.ErrJournalCorrupt, "a feed only reads")
}

// TestUnreadableRunIsInternal: a run whose run_created names a blob
// PAL_BLOBS does not hold can never be read. Every path answers internal
// (REST and the NATS service 500, gRPC INTERNAL), not unavailable (503:
// worth retrying).
func TestUnreadableRunIsInternal(t *testing.T) {
	t.Parallel()
	b := setup(t, withoutJournalCheck())
	ctx := context.Background()
	runID := event.NewRunID()
	wf := `{"name":"one","nodes":[{"id":"start","type":"trigger"}],"edges":[]}`
	ev := event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(wf), Input: json.RawMessage(`{}`)})
	ev.Data = json.RawMessage(fmt.Sprintf(`{"workflow":%s,"input_blob":{"blob":%q,"size":5},"depth":0}`,
		wf, event.BlobSum([]byte("nope!"))))
	ev.WorkerID = "test"
	_, err := b.Store.Append(ctx, runID, eventstore.Head{}, ev)
	require.NoError(t, err)

	requireError(t, b.get(t, "/v1/runs/"+runID), http.StatusInternalServerError, "internal")
	svc, err := api.StartService(ctx, b.NC, b.Runs, paltest.Logger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })

	m, err := b.NC.Request("pal.api.runs.get", fmt.Appendf(nil, `{"run_id":%q}`, runID), 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, "500", m.Header.Get(micro.ErrorCodeHeader), "%s", m.Data)

	gctx, cancel := context.WithTimeout(withBearer(ctx, testToken), 30*time.Second)
	defer cancel()
	_, err = b.grpcClient(t).GetRun(gctx, &palv1.GetRunRequest{RunId: runID})
	require.Equal(t, codes.Internal, status.Code(err), "%v", err)
}
