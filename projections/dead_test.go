package projections_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/runs"
)

// TestFoldPanicSkipsTheRun makes the fold panic on one run (a test hook:
// no journal is known to make the engine's fold panic). The projector
// records the run as broken, as it does a journal that does not fold: its
// journal rows are written, it gets no derived rows, its messages are not
// redelivered (the checkpoint reaches the end of the stream), and the
// other runs are projected.
func TestFoldPanicSkipsTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const bad = "run_fold_panics"
	p := projections.New(b.pool, b.Store, projections.Config{Logger: paltest.Logger(t)})
	projections.SetFoldHook(p, func(runID string) {
		if runID == bad {
			panic("fold bug")
		}
	})
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, p.Start(sctx))
	t.Cleanup(func() { stopProjector(t, p) })
	b.worker(t, "w1")

	_, err := b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: bad, Workflow: json.RawMessage(echoChain(3)), Input: json.RawMessage(`{"v":"x"}`), By: "test"})
	require.NoError(t, err)
	good := b.Start(t, echoChain(3), `{"v":"y"}`)
	end := b.WaitEnd(t, bad)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, good).Kind)
	caughtUp(t, p)

	require.Equal(t, uint64(1), p.Stats().FoldErrors, "the run is broken once; its later events are skipped")
	var journal, runRows, stepRows int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM journal_events WHERE run_id = $1", bad).Scan(&journal))
	require.Equal(t, len(b.Events(t, bad)), journal, "its journal rows are written")
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM runs WHERE run_id = $1", bad).Scan(&runRows))
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM steps WHERE run_id = $1", bad).Scan(&stepRows))
	require.Zero(t, runRows+stepRows, "no derived rows from a fold that panicked")
	var status string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT status FROM runs WHERE run_id = $1", good).Scan(&status))
	require.Equal(t, "succeeded", status, "the other run is projected")
}
