package api_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
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
