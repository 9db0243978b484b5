package projections_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

func rebuild(t *testing.T, b *bundle) projections.RebuildResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	var phases []string
	res, err := projections.Rebuild(ctx, b.pool, b.JS, projections.RebuildOptions{
		Logger:    paltest.Logger(t),
		BatchSize: 64, // several batches even for a small stream
		Progress: func(p projections.RebuildProgress) {
			mu.Lock()
			defer mu.Unlock()
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
		},
	})
	require.NoError(t, err)
	require.Contains(t, phases, projections.PhaseSwap)
	var schemas int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", projections.StagingSchema).Scan(&schemas))
	require.Zero(t, schemas, "the staging schema is dropped")
	return res
}

func TestRebuildEqualsLive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.projector(t, projections.Config{})
	b.worker(t, "w1")
	for _, id := range workload(t, b) {
		b.WaitEnd(t, id)
	}
	caughtUp(t, p)
	live := takeSnapshot(t, b.pool, false)
	stopProjector(t, p)

	res := rebuild(t, b)
	rebuilt := takeSnapshot(t, b.pool, false)
	requireSnapshotsEqual(t, live, rebuilt)
	require.Equal(t, int64(len(live["journal_events"])), res.JournalRows)
	require.Equal(t, uint64(len(live["journal_events"])), res.Events)
	require.Equal(t, int64(len(live["runs"])), res.Runs)
	require.Equal(t, int64(len(live["steps"])), res.Steps)
	require.Equal(t, int64(len(live["side_effect_receipts"])), res.Receipts)
	j := requireProjectionMatchesStream(t, b.pool, b.NC)
	requireRowsMatchFold(t, b.pool, j)

	// A projector started on the rebuilt tables takes over at their
	// checkpoint and finds nothing to do.
	p2 := b.projector(t, projections.Config{})
	require.Equal(t, res.StreamSeq, p2.Stats().Checkpoint)
	after := b.Start(t, echoChain(3), `{"v":"after"}`)
	b.worker(t, "w2")
	b.WaitEnd(t, after)
	caughtUp(t, p2)
	requireProjectionMatchesStream(t, b.pool, b.NC)
}

// TestRebuildWhileLive rebuilds while runs start and execute and the live
// projector writes: the live projector waits for the swap and carries on
// in the new tables, readers keep working, and the result equals a second
// rebuild.
func TestRebuildWhileLive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.projector(t, projections.Config{BatchSize: 50})
	b.worker(t, "w1")
	q := projections.NewReader(b.pool)
	ctx := context.Background()

	// One run waits on a held LLM call across the rebuild.
	held := b.LLM.Hold(func(c providertest.Call) bool { return strings.HasPrefix(c.LastUser(), "step 2") })
	ids := []string{b.Start(t, seqWorkflow(3, "openai"), `{"topic":"held"}`)}
	_, err := held.Wait(ctxTimeout(t, 30*time.Second))
	require.NoError(t, err)
	// Others start and run all along.
	stop := make(chan struct{})
	started := make(chan string, 1000)
	go func() {
		defer close(started)
		for {
			select {
			case <-stop:
				return
			default:
			}
			res, err := b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(echoChain(10)), Input: json.RawMessage(`{"v":"bg"}`)})
			if err != nil {
				t.Errorf("starting a run: %v", err)
				return
			}
			started <- res.RunID
			time.Sleep(2 * time.Millisecond) // pace the load: this is the rebuild's background, not a benchmark
		}
	}()
	require.NoError(t, p.WaitFor(ctxTimeout(t, 30*time.Second), 200))
	_, err = q.ListRuns(ctx, projections.RunFilter{}) // a cached statement on the old tables
	require.NoError(t, err)
	before := p.Stats().Batches
	res := rebuild(t, b)
	require.Greater(t, p.Stats().Batches, before, "the live projector kept writing")
	close(stop)
	for id := range started {
		ids = append(ids, id)
	}
	held.Release()
	for _, id := range ids {
		b.WaitEnd(t, id)
	}
	caughtUp(t, p)
	last, err := q.Checkpoint(ctx, "")
	require.NoError(t, err)
	require.Greater(t, last, res.StreamSeq, "events were appended after the rebuild's checkpoint")
	require.Zero(t, p.Stats().WriteRetries, "the live projector waited for the swap without an error")
	all, err := q.ListRuns(ctx, projections.RunFilter{Limit: projections.MaxListLimit})
	require.NoError(t, err)
	require.Len(t, all, len(ids))
	j := requireProjectionMatchesStream(t, b.pool, b.NC)
	requireRowsMatchFold(t, b.pool, j)

	live := takeSnapshot(t, b.pool, false)
	stopProjector(t, p)
	rebuild(t, b)
	requireSnapshotsEqual(t, live, takeSnapshot(t, b.pool, false))
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
