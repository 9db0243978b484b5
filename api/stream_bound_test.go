package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
)

// bigRun starts a run and appends steps to it, each an 8 KiB output in a
// message of its own (packed per step, as PAL_DURABILITY=strict writes
// them), until its journal holds at least size bytes. The run stays open.
// It returns the run's id, its head and the journal's bytes.
func bigRun(tb testing.TB, js jetstream.JetStream, size int) (string, eventstore.Head, int) {
	tb.Helper()
	ctx := context.Background()
	store, err := eventstore.Open(ctx, js, eventstore.WithPacking(true))
	require.NoError(tb, err)
	res, err := runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(echoWorkflow), Input: json.RawMessage(`{}`), By: "test"})
	require.NoError(tb, err)
	head, err := store.LastHead(ctx, res.RunID)
	require.NoError(tb, err)
	appendEvs := func(evs ...event.Event) {
		for i := range evs {
			evs[i].WorkerID = "bench"
		}
		head, err = store.Append(ctx, res.RunID, head, evs...)
		require.NoError(tb, err)
	}
	appendEvs(event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "bench", ResumeCount: 1}))
	output, err := json.Marshal(map[string]string{"text": strings.Repeat("lorem ipsum ", 8<<10/12)})
	require.NoError(tb, err)
	total := 0
	for i := 0; total < size; i++ {
		step := fmt.Sprintf("s%d", i)
		started := event.MustNew(event.StepStarted, step, 1, event.StepStartedData{NodeID: step, NodeType: "tool",
			Input: json.RawMessage(`{}`), IdempotencyKey: event.IdempotencyKey(res.RunID, step, 1)})
		appendEvs(started, event.MustNew(event.StepCompleted, step, 1, event.StepCompletedData{Output: output}))
		total += len(output) + 600
	}
	return res.RunID, head, total
}

// ownStore has the handler read through a store of its own, so that its
// ReadStats count the API's reads and nothing else.
func ownStore(tb testing.TB, store **eventstore.Store) bundleOpt {
	return withHandler(func(hc *api.HandlerConfig) {
		s, err := eventstore.Open(context.Background(), hc.Store.JetStream())
		require.NoError(tb, err)
		*store, hc.Store = s, s
	})
}

// idleStream opens GET /v1/runs/{id}/events on a bare connection and never
// reads from it: the server writes until the connection's buffers are
// full, then the stream waits on its write, as it does for a client that
// has stopped reading.
func idleStream(tb testing.TB, addr, runID, token string) net.Conn {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close() })
	// A fixed receive buffer (the kernel doubles it), so what the
	// connection takes does not depend on the machine's settings.
	require.NoError(tb, conn.(*net.TCPConn).SetReadBuffer(64<<10))
	_, err = fmt.Fprintf(conn, "GET /v1/runs/%s/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", runID, addr, token)
	require.NoError(tb, err)
	return conn
}

// settled waits until read, a count that grows while the server works,
// has not moved for half a second, and returns it.
func settled(tb testing.TB, read func() uint64) uint64 {
	tb.Helper()
	last, still := read(), 0
	deadline := time.Now().Add(2 * time.Minute)
	for still < 5 {
		require.True(tb, time.Now().Before(deadline), "the server's reads did not settle")
		time.Sleep(100 * time.Millisecond)
		n := read()
		if n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
	return last
}

// TestIdleStreamsReadAPage opens 100 event streams from the start of a
// run whose journal holds 20 MB, and reads none of them: each stream
// reads what its connection's buffers take (the kernel's, bounded on the
// server's side to 2×256 KiB and on this client's to 2×64 KiB) and a
// page more, not the journal (the server's reads are counted, not timed).
func TestIdleStreamsReadAPage(t *testing.T) {
	t.Parallel()
	var store *eventstore.Store
	b := setup(t, ownStore(t, &store))
	runID, _, size := bigRun(t, b.JS, 20<<20)
	before := store.ReadStats()
	const n = 100
	addr := strings.TrimPrefix(b.url, "http://")
	for range n {
		idleStream(t, addr, runID, testToken)
	}
	bytes := settled(t, func() uint64 { return store.ReadStats().Bytes }) - before.Bytes
	msgs := store.ReadStats().Messages - before.Messages
	perStream := bytes / n
	t.Logf("%d idle streams on a %d MB journal: %d KiB (%d messages) read per stream", n, size>>20, perStream>>10, msgs/n)
	require.Less(t, perStream, uint64(1<<20), "a stream that is not read reads no more than its connection takes, and a page")
}

// TestReconnectAtTheHeadReadsOneMessage: 100 reconnects with nothing
// left to send read one message each, the run's last, whatever the
// journal's size: to a run in flight (the stream is open at once, with
// nothing in it, and follows the run live) and to one that has ended
// (204).
func TestReconnectAtTheHeadReadsOneMessage(t *testing.T) {
	t.Parallel()
	var store *eventstore.Store
	b := setup(t, ownStore(t, &store))
	runID, head, _ := bigRun(t, b.JS, 2<<20)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	const n = 100
	last := strconv.FormatUint(head.Seq, 10)
	before := store.ReadStats()
	for range n {
		s, err := b.openSSE(t, client, runID, "", "Last-Event-ID", last)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, s.res.StatusCode)
		line, err := s.r.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "retry: 1000\n", line, "the stream is open before there is anything to send")
		s.close()
	}
	got := store.ReadStats()
	require.Equal(t, uint64(n), got.Messages-before.Messages, "each reconnect reads one message")

	end := event.MustNew(event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{}`)})
	end.WorkerID = "bench"
	b.AppendRaw(t, runID, end)
	last = strconv.FormatUint(head.Seq+1, 10)
	before = store.ReadStats()
	for range n {
		r := b.get(t, "/v1/runs/"+runID+"/events", "Last-Event-ID", last)
		require.Equal(t, http.StatusNoContent, r.status)
	}
	require.Equal(t, uint64(n), store.ReadStats().Messages-before.Messages, "each reconnect after the end reads one message")
}

// TestLaggingStreamGoesBackToTheJournal: a client that stops reading
// while a run moves on by more events than the run's feed holds for it
// (subscriptionBuffer, 512) is dropped by the feed, and its stream goes
// back to reading the journal: when the client reads again it gets every
// event once, in order, to the end, on the same connection.
func TestLaggingStreamGoesBackToTheJournal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	runID, head, _ := bigRun(t, b.JS, 64<<10)
	// A fixed receive buffer: the kernel does not grow it to hold what
	// the client does not read.
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			err = c.(*net.TCPConn).SetReadBuffer(64 << 10)
		}
		return c, err
	}}}
	defer client.CloseIdleConnections()
	s, err := b.openSSE(t, client, runID, "")
	require.NoError(t, err)
	defer s.close()
	got := s.readUntil(t, func(ev sseEvent) bool { return ev.id == head.Seq })

	// 1,200 events, half of them 8 KiB, while the client reads nothing:
	// more than the connection's buffers (about 80 of the big ones) and
	// the feed's 512 hold.
	store, err := eventstore.Open(ctx, b.JS, eventstore.WithPacking(true))
	require.NoError(t, err)
	output, err := json.Marshal(map[string]string{"text": strings.Repeat("x", 8<<10)})
	require.NoError(t, err)
	h := head
	for i := range 600 {
		step := fmt.Sprintf("late%d", i)
		evs := []event.Event{
			event.MustNew(event.StepStarted, step, 1, event.StepStartedData{NodeID: step, NodeType: "tool",
				Input: json.RawMessage(`{}`), IdempotencyKey: event.IdempotencyKey(runID, step, 1)}),
			event.MustNew(event.StepCompleted, step, 1, event.StepCompletedData{Output: output}),
		}
		for i := range evs {
			evs[i].WorkerID = "bench"
		}
		h, err = store.Append(ctx, runID, h, evs...)
		require.NoError(t, err)
	}
	end := event.MustNew(event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{}`)})
	end.WorkerID = "bench"
	_, err = store.Append(ctx, runID, h, end)
	require.NoError(t, err)

	got = append(got, s.readAll(t)...)
	require.Len(t, got, int(h.Seq)+1)
	for i, ev := range got {
		require.Equal(t, uint64(i+1), ev.id, "every event once, in order")
	}
	require.Equal(t, "run_succeeded", got[len(got)-1].kind)
}
