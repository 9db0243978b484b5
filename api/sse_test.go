package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// TestSSEReconnect disconnects a client mid-run, lets the run move on while
// it is away, and reconnects with Last-Event-ID: every event of the run
// arrives exactly once across the two connections, in order, and the
// server ends the stream after the terminal event.
func TestSSEReconnect(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	const runID = "run_sse"
	holdS2 := b.LLM.Hold(providertest.ByKey(event.IdempotencyKey(runID, "s2", 1)))
	holdS3 := b.LLM.Hold(providertest.ByKey(event.IdempotencyKey(runID, "s3", 1)))
	t.Cleanup(holdS2.Release)
	t.Cleanup(holdS3.Release)
	res := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":%s,"input":{"topic":"SSE"},"run_id":%q}`, seqWorkflow(4), runID))
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	first, err := b.openSSE(t, client, runID, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, first.res.StatusCode)
	require.Equal(t, "text/event-stream", first.res.Header.Get("Content-Type"))
	got := first.readUntil(t, func(ev sseEvent) bool { return ev.kind == "step_started" && ev.event.StepID == "s2" })
	first.close() // mid-run: s2's call is held at the provider

	// While the client is away the run moves on to s3.
	holdS2.Release()
	b.WaitFor(t, runID, "s3 started", func(ev event.Event) bool { return ev.Kind == event.StepStarted && ev.StepID == "s3" })

	last := got[len(got)-1].id
	second, err := b.openSSE(t, client, runID, "", "Last-Event-ID", strconv.FormatUint(last, 10))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, second.res.StatusCode)
	got = append(got, second.readUntil(t, func(ev sseEvent) bool { return ev.kind == "step_started" && ev.event.StepID == "s3" })...)
	// And it goes on live after the reconnect.
	holdS3.Release()
	got = append(got, second.readAll(t)...) // ends when the server closes the stream
	second.close()

	journal := b.Events(t, runID)
	require.Equal(t, event.RunSucceeded, journal[len(journal)-1].Kind)
	require.Len(t, got, len(journal), "every event exactly once")
	for i, ev := range got {
		require.Equal(t, uint64(i+1), ev.id, "ids are the run's seq, in order, no gap, no duplicate")
		require.Equal(t, string(journal[i].Kind), ev.kind)
		require.Equal(t, journal[i].Seq, ev.event.Seq)
		require.Equal(t, runID, ev.event.RunID)
		want, err := json.Marshal(journal[i])
		require.NoError(t, err)
		require.JSONEq(t, string(want), string(ev.data), "data is the envelope")
	}

	// A reconnect after the terminal event: 204, so an EventSource stops.
	r := b.get(t, "/v1/runs/"+runID+"/events", "Last-Event-ID", strconv.Itoa(len(journal)))
	require.Equal(t, http.StatusNoContent, r.status)
	// ?after= starts a fresh client in the middle; the header wins over it.
	third, err := b.openSSE(t, client, runID, "?after=3")
	require.NoError(t, err)
	tail := third.readAll(t)
	third.close()
	require.Len(t, tail, len(journal)-3)
	require.Equal(t, uint64(4), tail[0].id)
	fourth, err := b.openSSE(t, client, runID, "?after=1", "Last-Event-ID", strconv.Itoa(len(journal)-1))
	require.NoError(t, err)
	tail = fourth.readAll(t)
	fourth.close()
	require.Len(t, tail, 1)
	require.Equal(t, "run_succeeded", tail[0].kind)
}

// TestSSEKeepAliveAndStop: an idle stream gets comment lines, a client that
// goes away ends its stream, and stopping the server ends open streams at
// once (goleak in TestMain checks that nothing is left behind).
func TestSSEKeepAliveAndStop(t *testing.T) {
	t.Parallel()
	b := setup(t, withKeepAlive(20*time.Millisecond)) // no worker: the run stays queued
	_, err := runs.New(b.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights, RunID: "run_idle", Workflow: json.RawMessage(echoWorkflow)})
	require.NoError(t, err)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	s, err := b.openSSE(t, client, "run_idle", "")
	require.NoError(t, err)
	ev, err := s.next()
	require.NoError(t, err)
	require.Equal(t, "run_created", ev.kind)
	for { // an idle stream gets comment lines
		line, err := s.r.ReadString('\n')
		require.NoError(t, err)
		if line == ": keep-alive\n" {
			break
		}
		require.Equal(t, "\n", line)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.next() // nothing more comes: only keep-alives until the end
		done <- err
	}()

	// A client that goes away: its stream ends.
	gone, err := b.openSSE(t, client, "run_idle", "")
	require.NoError(t, err)
	_, err = gone.next()
	require.NoError(t, err)
	gone.close()

	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, b.srv.Stop(sctx))
	require.Less(t, time.Since(start), 3*time.Second, "Stop must end open streams, not wait for them")
	select {
	case err := <-done:
		require.ErrorIs(t, err, io.EOF)
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end when the server stopped")
	}
	s.close()
}

// TestSSEDeltas: with ?deltas=1 a stream interleaves the text of an LLM
// step as the provider writes it (event: delta, no id) with the journal's
// events, which keep their ids one by one: the text so far arrives while
// the call is held midway, and the deltas of the call add up to the
// answer step_completed journals. A bad deltas value is refused.
func TestSSEDeltas(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	const runID = "run_sse_deltas"
	hold := b.LLM.HoldAfter(providertest.ByKey(event.IdempotencyKey(runID, "s1", 1)), 2)
	t.Cleanup(hold.Release)
	res := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":%s,"input":{"topic":"deltas"},"run_id":%q}`, seqWorkflow(1), runID))
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	s, err := b.openSSE(t, client, runID, "?deltas=1")
	require.NoError(t, err)
	defer s.close()
	require.Equal(t, http.StatusOK, s.res.StatusCode)
	_, err = hold.Wait(t.Context())
	require.NoError(t, err)
	var deltas []event.Delta
	var journal []sseEvent
	take := func(evs []sseEvent) {
		for _, ev := range evs {
			if ev.kind != "delta" {
				journal = append(journal, ev)
				continue
			}
			require.Zero(t, ev.id, "a delta has no id: Last-Event-ID resumes the journal")
			var d event.Delta
			require.NoError(t, json.Unmarshal(ev.data, &d))
			deltas = append(deltas, d)
		}
	}
	take(s.readUntil(t, func(ev sseEvent) bool { return ev.kind == "delta" && strings.Contains(string(ev.data), `"index":1`) }))
	require.Len(t, deltas, 2, "the text so far, while the call is held")
	require.Equal(t, "echo: step", deltas[0].Text+deltas[1].Text)
	require.True(t, deltas[0].Reset)
	hold.Release()
	take(s.readAll(t))

	evs := b.Events(t, runID)
	require.Len(t, journal, len(evs), "every journal event once")
	for i, ev := range journal {
		require.Equal(t, evs[i].Seq, ev.id)
		require.Equal(t, string(evs[i].Kind), ev.kind)
	}
	var text strings.Builder
	for i, d := range deltas {
		require.Equal(t, "s1", d.StepID)
		require.Equal(t, i, d.Index, "in order, once each")
		text.WriteString(d.Text)
	}
	var out struct {
		Text string `json:"text"`
	}
	for _, ev := range evs {
		if ev.Kind == event.StepCompleted && ev.StepID == "s1" {
			var d event.StepCompletedData
			require.NoError(t, ev.DecodeData(&d))
			require.NoError(t, json.Unmarshal(d.Output, &out))
		}
	}
	require.Equal(t, out.Text, text.String(), "the deltas are the answer")

	r := b.get(t, "/v1/runs/"+runID+"/events?deltas=yes")
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
}
