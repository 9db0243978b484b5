package projections_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

func TestParseRetention(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"", 0, ""},
		{"30d", 30 * 24 * time.Hour, ""},
		{" 12h ", 12 * time.Hour, ""},
		{"90m", 90 * time.Minute, ""},
		{"1h", time.Hour, ""},
		{"59m", 0, "below the minimum 1h0m0s"},
		{"1s", 0, "below the minimum"},
		{"0d", 0, "whole number of days"},
		{"-3d", 0, "whole number of days"},
		{"1.5d", 0, "whole number of days"},
		{"99999d", 0, "whole number of days"},
		{"-2h", 0, "below the minimum"},
		{"forever", 0, "want a number of days (30d) or a Go duration"},
	} {
		got, err := projections.ParseRetention(c.in)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, "%q", c.in)
			require.ErrorContains(t, err, "PAL_RETENTION", "%q", c.in)
			continue
		}
		require.NoError(t, err, "%q", c.in)
		require.Equal(t, c.want, got, "%q", c.in)
	}
}

// rowCounts are a run's rows in the projection.
type rowCounts struct{ runs, steps, journal int }

func countRows(t *testing.T, b *bundle, runID string) rowCounts {
	t.Helper()
	var c rowCounts
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM runs WHERE run_id = $1), (SELECT count(*) FROM steps WHERE run_id = $1),
		(SELECT count(*) FROM journal_events WHERE run_id = $1)`, runID).Scan(&c.runs, &c.steps, &c.journal))
	return c
}

func hasJournal(t *testing.T, b *bundle, runID string) bool {
	t.Helper()
	_, head, err := b.Store.LastEvent(context.Background(), runID)
	require.NoError(t, err)
	return head.Seq > 0
}

// TestRetentionRemovesOldFinishedJournals: a pass removes the journal of
// a run that ended longer ago than the
// retention, keeps its rows, and leaves a young finished run and a run in
// flight alone, even one whose row wrongly says it ended long ago. The
// removed run reads from its rows (API) and is never re-driven; a rebuild
// keeps its rows.
func TestRetentionRemovesOldFinishedJournals(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	b.worker(t, "w1")
	p := b.projector(t, projections.Config{Retention: projections.MinRetention})

	// Two objects in PAL_BLOBS: the old run's input holds a look-alike
	// reference to one, nobody names the other.
	obs, err := b.JS.ObjectStore(ctx, eventstore.BlobBucket) // made by Setup
	require.NoError(t, err)
	_, err = obs.PutBytes(ctx, "sha256-old", bytes.Repeat([]byte("o"), 1000))
	require.NoError(t, err)
	_, err = obs.PutBytes(ctx, "sha256-other", []byte("x"))
	require.NoError(t, err)

	// One after the other, so the old run's last message is not the
	// stream's last (which retention never purges).
	old := b.Start(t, echoChain(3), `{"v":"old","doc":{"blob":"sha256-old","size":1000}}`)
	b.WaitEnd(t, old)
	young := b.Start(t, echoChain(3), `{"v":"young"}`)
	parked := b.Start(t, gateWorkflow, `{}`)
	b.WaitEnd(t, young)
	b.WaitFor(t, parked, "the approval wait", func(ev event.Event) bool { return ev.StepID == "gate" })
	caughtUp(t, p)
	oldRows := countRows(t, b, old)
	require.Equal(t, 1, oldRows.runs)
	require.Positive(t, oldRows.steps)
	require.Positive(t, oldRows.journal)

	// Age the old run past the retention, and make the parked run's row
	// claim it ended as long ago: the journal, not the row, decides.
	_, err = b.pool.Exec(ctx, "UPDATE runs SET ended_at = now() - interval '2 hours' WHERE run_id = ANY($1)", []string{old, parked})
	require.NoError(t, err)

	n, err := p.RemoveExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.False(t, hasJournal(t, b, old), "the old run's journal is purged")
	require.True(t, hasJournal(t, b, young), "a young run keeps its journal")
	require.True(t, hasJournal(t, b, parked), "a run in flight keeps its journal")
	_, _, err = b.Store.Read(ctx, old)
	require.ErrorIs(t, err, eventstore.ErrRunNotFound)

	got := countRows(t, b, old)
	require.Equal(t, rowCounts{runs: 1, steps: oldRows.steps}, got, "runs and steps stay, journal_events go")
	require.Equal(t, countRows(t, b, young).journal, len(b.Events(t, young)))
	// A value shaped like a reference names no blob: retention deletes
	// neither object (TestRetentionUnderRoles deletes a real one).
	_, err = obs.GetInfo(ctx, "sha256-old")
	require.NoError(t, err, "retention deleted a blob")
	_, err = obs.GetInfo(ctx, "sha256-other")
	require.NoError(t, err, "retention deleted a blob")

	reader := projections.NewReader(b.pool)
	d, err := reader.GetRun(ctx, old)
	require.NoError(t, err)
	require.False(t, d.Run.JournalRemovedAt.IsZero())
	require.Equal(t, engine.StatusSucceeded, d.Run.Status)

	// A second pass finds nothing: removed runs are out of the index.
	n, err = p.RemoveExpired(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	// The sweep does not re-drive it, even with a stray index entry and a
	// work message for it: the worker drops work for a run with no journal.
	require.NoError(t, b.Store.MarkInflight("", old)(ctx))
	sweeper := workers.NewSweeper(b.Store, b.Leases, workers.Sources(reader, workers.NewInflightSource(b.Store)), time.Hour, paltest.Logger(t))
	swept, err := sweeper.SweepOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, swept)
	unsigned, err := reader.Unsigned(ctx, 100)
	require.NoError(t, err)
	require.NotContains(t, unsigned, old, "the receipt sweep cannot sign a removed journal")
	require.NoError(t, b.Store.Enqueue(ctx, "", old, "test"))
	require.Eventually(t, func() bool {
		pending, err := b.Store.WorkPending(ctx, "", old)
		require.NoError(t, err)
		return !pending
	}, 30*time.Second, 10*time.Millisecond)
	require.False(t, hasJournal(t, b, old), "nothing was appended to the removed run")

	// GET /v1/runs/{id} answers from the rows and says the journal went;
	// its event feed answers 410.
	h := api.NewHandler(api.HandlerConfig{Store: b.Store, Runs: reader, Insecure: true, Logger: paltest.Logger(t)})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/runs/"+old, nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var view runs.RunView
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &view))
	require.Equal(t, engine.StatusSucceeded, view.Status)
	require.NotEmpty(t, view.JournalRemovedAt)
	require.Len(t, view.Steps, 3)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/runs/"+old+"/events", nil))
	require.Equal(t, http.StatusGone, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "removed by retention")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/runs/run_never_was", nil))
	require.Equal(t, http.StatusNotFound, rec.Code)

	// A rebuild cannot replay the removed run, so it keeps its rows.
	_, err = projections.Rebuild(ctx, b.pool, b.JS, projections.RebuildOptions{Logger: paltest.Logger(t)})
	require.NoError(t, err)
	require.Equal(t, rowCounts{runs: 1, steps: oldRows.steps}, countRows(t, b, old))
	d, err = reader.GetRun(ctx, old)
	require.NoError(t, err)
	require.False(t, d.Run.JournalRemovedAt.IsZero())
	require.Equal(t, countRows(t, b, young).journal, len(b.Events(t, young)))
}

// TestRetentionLoop: the projector's own pass removes a finished run's
// journal once it is older than the retention, not before.
func TestRetentionLoop(t *testing.T) {
	projections.SetMinRetention(t, time.Second)
	b := setup(t)
	b.worker(t, "w1")
	const retention = 3 * time.Second
	p := b.projector(t, projections.Config{Retention: retention})

	// A big input: PAL_BLOBS keeps it, and only this run references it.
	input := `{"v":"x","doc":"` + strings.Repeat("d", 300<<10) + `"}`
	sum := event.BlobSum([]byte(input))
	obs, err := b.JS.ObjectStore(context.Background(), eventstore.BlobBucket)
	require.NoError(t, err)
	id := b.Start(t, echoChain(2), input)
	end := b.WaitEnd(t, id)
	// A later run, so id's last message is not the stream's last (which
	// retention never purges); it stays parked, in flight.
	parked := b.Start(t, gateWorkflow, `{}`)
	b.WaitFor(t, parked, "the approval wait", func(ev event.Event) bool { return ev.StepID == "gate" })
	caughtUp(t, p)
	if time.Since(end.TS) < retention {
		require.True(t, hasJournal(t, b, id), "a run younger than the retention keeps its journal")
	}
	require.Eventually(t, func() bool { return !hasJournal(t, b, id) }, 30*time.Second, 20*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(end.TS), retention, "removed no earlier than the retention")
	require.Equal(t, 1, countRows(t, b, id).runs)
	require.True(t, hasJournal(t, b, parked))
	// The blobs are released after the journal is purged.
	require.Eventually(t, func() bool {
		_, err := obs.GetInfo(context.Background(), sum)
		return errors.Is(err, jetstream.ErrObjectNotFound)
	}, 30*time.Second, 20*time.Millisecond, "the run's blob went with its journal")
	caughtUp(t, p) // the projector's checkpoint still reaches the stream's end
}

// TestRetentionBelowMinimum: a projector refuses a retention below the
// minimum.
func TestRetentionBelowMinimum(t *testing.T) {
	b := setup(t)
	p := projections.New(b.pool, b.Store, projections.Config{Retention: time.Minute})
	err := p.Start(context.Background())
	require.ErrorContains(t, err, "below the minimum")
}

// TestRetentionRetriesPendingBlobs: the blobs of a removed run are
// released after its journal is purged; a release that fails (here: it
// cannot take the blob's mark before the pass's context ends) leaves them
// in runs.blobs_pending, and a later pass releases them.
func TestRetentionRetriesPendingBlobs(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	b.worker(t, "w1")
	p := b.projector(t, projections.Config{Retention: projections.MinRetention})
	input := `{"v":"x","doc":"` + strings.Repeat("p", 300<<10) + `"}`
	sum := event.BlobSum([]byte(input))
	id := b.Start(t, echoChain(1), input)
	b.WaitEnd(t, id)
	later := b.Start(t, echoChain(1), `{"v":"later"}`) // so id's last message is not the stream's last
	b.WaitEnd(t, later)
	caughtUp(t, p)
	_, err := b.pool.Exec(ctx, "UPDATE runs SET ended_at = now() - interval '2 hours' WHERE run_id = $1", id)
	require.NoError(t, err)
	obs, err := b.JS.ObjectStore(ctx, eventstore.BlobBucket)
	require.NoError(t, err)

	// Another release holds the blob's mark.
	mark, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: eventstore.BlobReclaimPrefix + sum},
		jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithMsgTTL(time.Minute))
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, _ = p.RemoveExpired(short) // the pass ends with its context
	require.False(t, hasJournal(t, b, id), "the journal is purged first")
	var pending []string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT blobs_pending FROM runs WHERE run_id = $1", id).Scan(&pending))
	require.Contains(t, pending, sum, "the release failed: its blobs wait")
	_, err = obs.GetInfo(ctx, sum)
	require.NoError(t, err, "the blob is still there")

	refs, err := b.JS.Stream(ctx, eventstore.BlobRefsStream)
	require.NoError(t, err)
	require.NoError(t, refs.DeleteMsg(ctx, mark.Sequence))
	n, err := p.RemoveExpired(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "no journal left to remove")
	_, err = obs.GetInfo(ctx, sum)
	require.ErrorIs(t, err, jetstream.ErrObjectNotFound, "a later pass released it")
	var cleared []string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT blobs_pending FROM runs WHERE run_id = $1", id).Scan(&cleared))
	require.Nil(t, cleared)
}
