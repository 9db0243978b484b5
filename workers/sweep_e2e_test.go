package workers_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// TestSweepRedrivesARunWithNoWork kills the worker driving a run with
// kill -9 and deletes the run's work message, so nothing would ever drive
// it again; a worker with DATABASE_URL finds it through the projection and
// drives it to the end.
func TestSweepRedrivesARunWithNoWork(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	pg := testenv.Postgres(t)
	pool := pg.Pool(t)
	_, err := projections.Migrate(ctx, pool)
	require.NoError(t, err)
	proj := projections.New(pool, p.Store, projections.Config{})
	require.NoError(t, proj.Start(ctx))
	t.Cleanup(func() { _ = proj.Stop(context.Background()) })

	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "s2", 1)))
	w1 := p.palWorker(t, "w1")
	_, err = runs.New(p.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(seqWorkflow(3, "openai")), Input: json.RawMessage(`{"topic":"orphan"}`)})
	require.NoError(t, err)
	_, err = hold.Wait(ctx)
	require.NoError(t, err)
	w1.Kill()
	hold.Release()

	// Lose the work message: the run is now an orphan.
	ws, err := p.JS.Stream(ctx, eventstore.WorkStream)
	require.NoError(t, err)
	m, err := ws.GetLastMsgForSubject(ctx, eventstore.WorkSubject("", runID))
	require.NoError(t, err)
	require.NoError(t, ws.DeleteMsg(ctx, m.Sequence))
	pending, err := p.Store.WorkPending(ctx, "", runID)
	require.NoError(t, err)
	require.False(t, pending)
	// And let w1's lease expire, so that w2 does not take the run over
	// from w1 at start (presence): only the sweep finds it.
	leases, err := eventstore.OpenLeases(ctx, p.JS, time.Second)
	require.NoError(t, err)
	require.NoError(t, leases.WaitFree(ctx, runID))

	w2 := p.palWorker(t, "w2", "DATABASE_URL="+pg.DSN(), "PAL_RECOVERY_INTERVAL=1s")
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	require.Contains(t, w2.Output(), "re-enqueued orphaned run")
	rs := resumesOf(t, p.Events(t, runID))
	require.Len(t, rs, 2)
	require.Equal(t, "w2", rs[1].Worker)
	require.True(t, rs[1].Crashed)
}

// TestSweepRedrivesAnOrphanWithoutPostgres is the orphan above with no
// DATABASE_URL anywhere: the worker's sweep finds the run in the
// PAL_INFLIGHT index, NATS alone, and drives it to the end.
func TestSweepRedrivesAnOrphanWithoutPostgres(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "s2", 1)))
	w1 := p.palWorker(t, "w1")
	_, err := runs.New(p.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(seqWorkflow(3, "openai")), Input: json.RawMessage(`{"topic":"orphan"}`)})
	require.NoError(t, err)
	_, err = hold.Wait(ctx)
	require.NoError(t, err)
	w1.Kill()
	hold.Release()

	ws, err := p.JS.Stream(ctx, eventstore.WorkStream)
	require.NoError(t, err)
	m, err := ws.GetLastMsgForSubject(ctx, eventstore.WorkSubject("", runID))
	require.NoError(t, err)
	require.NoError(t, ws.DeleteMsg(ctx, m.Sequence))
	leases, err := eventstore.OpenLeases(ctx, p.JS, time.Second)
	require.NoError(t, err)
	require.NoError(t, leases.WaitFree(ctx, runID))
	inflight, err := p.Store.InflightRuns(ctx)
	require.NoError(t, err)
	require.Len(t, inflight, 1)
	require.Equal(t, runID, inflight[0].RunID)

	w2 := p.palWorker(t, "w2", "PAL_RECOVERY_INTERVAL=1s")
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	require.Contains(t, w2.Output(), "re-enqueued orphaned run")
	require.NotContains(t, w2.Output(), "took over the runs")
	rs := resumesOf(t, p.Events(t, runID))
	require.Len(t, rs, 2)
	require.Equal(t, "w2", rs[1].Worker)
	// The run's end took it out of the index.
	require.Eventually(t, func() bool {
		left, err := p.Store.InflightRuns(ctx)
		return err == nil && len(left) == 0
	}, 10*time.Second, 10*time.Millisecond)
}
