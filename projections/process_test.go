package projections_test

// Tests of the pal commands as real processes: pal migrate, pal projector
// killed with kill -9 mid-batch, pal projections rebuild.

import (
	"errors"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
)

// exitCode waits for p and returns its exit status.
func exitCode(t *testing.T, p *testenv.Process) int {
	t.Helper()
	err := p.Wait(ctxTimeout(t, time.Minute))
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)

	p := testenv.StartProcess(t, bin, []string{"migrate"}, nil)
	require.Equal(t, 2, exitCode(t, p), p.Output())
	require.Contains(t, p.Output(), "DATABASE_URL is not set")

	p = testenv.StartProcess(t, bin, []string{"migrate"}, []string{"DATABASE_URL=postgres://pal@127.0.0.1:1/pal?connect_timeout=2"})
	require.Equal(t, 4, exitCode(t, p), p.Output())
	require.Contains(t, p.Output(), "cannot reach Postgres at 127.0.0.1:1/pal")

	pg := testenv.Postgres(t)
	p = testenv.StartProcess(t, bin, []string{"migrate"}, []string{"DATABASE_URL=" + pg.DSN()})
	require.Equal(t, 0, exitCode(t, p), p.Output())
	require.Contains(t, p.Output(), "applied 0001_initial.sql")

	p = testenv.StartProcess(t, bin, []string{"migrate", "--database-url", pg.DSN()}, nil)
	require.Equal(t, 0, exitCode(t, p), p.Output())
	ms, err := projections.Migrations()
	require.NoError(t, err)
	require.Contains(t, p.Output(), fmt.Sprintf("schema up to date (version %d)", ms[len(ms)-1].Version))
}

// TestProjectorKill9MidBatch kills a pal projector process while a batch is
// half written: Postgres has its journal rows, its transaction is open.
// A lock the test holds on the steps table stops the batch there. Nothing
// of the batch is visible afterwards; a new projector writes everything
// again, and the rows equal the stream. It is then killed again while
// catching up at full speed, and a third one finishes the job.
func TestProjectorKill9MidBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bin := testenv.PalBinary(t)
	ctx := ctxTimeout(t, 3*time.Minute)

	// A backlog of big batches: many runs of many echo steps, driven by
	// two pal worker processes.
	for _, id := range []string{"w1", "w2"} {
		w := testenv.StartProcess(t, bin, []string{"worker"}, []string{"PAL_NATS_URL=" + b.NATS.URL(),
			"PAL_WORKER_ID=" + id, "PAL_LEASE_TTL=1s"})
		require.NoError(t, w.WaitForOutput(ctx, "worker ready"), w.Output())
	}
	var runs []string
	for range 30 {
		runs = append(runs, b.Start(t, echoChain(100), `{"v":"kill -9"}`))
	}
	for _, id := range runs {
		b.WaitEnd(t, id)
	}
	stream, err := b.JS.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	last := stream.CachedInfo().State.LastSeq

	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE steps IN EXCLUSIVE MODE")
	require.NoError(t, err)

	env := []string{"PAL_NATS_URL=" + b.NATS.URL(), "DATABASE_URL=" + b.pg.DSN(), "PAL_LOG_LEVEL=debug"}
	start := func() *testenv.Process {
		p := testenv.StartProcess(t, bin, []string{"projector"}, env)
		require.NoError(t, p.WaitForOutput(ctx, "projector ready"), p.Output())
		return p
	}
	p1 := start()
	// Its first batch has written journal_events and runs and waits for the
	// lock on steps.
	var pid int
	require.Eventually(t, func() bool {
		err := b.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO steps%'`).Scan(&pid)
		return err == nil
	}, 30*time.Second, 5*time.Millisecond, "the projector's batch never reached the steps table")
	p1.Kill()
	// A server that notices its client is gone rolls the transaction back.
	_, err = b.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	// Exactly the batches committed before it are visible: every event up
	// to the checkpoint, nothing after it.
	q := projections.NewReader(b.pool)
	cp, err := q.Checkpoint(ctx, "")
	require.NoError(t, err)
	want := 0
	for _, m := range readStream(t, b.JS) {
		if m.seq <= cp {
			want += len(m.evs)
		}
	}
	var rows, after int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE stream_seq > $1) FROM journal_events", cp).Scan(&rows, &after))
	require.Equal(t, want, rows, "journal rows up to the checkpoint %d", cp)
	require.Zero(t, after, "nothing of the half-written batch is visible")
	require.Less(t, cp, last)

	// Kill the next one as soon as it has committed something.
	p2 := start()
	require.Eventually(t, func() bool {
		cp, err = q.Checkpoint(ctx, "")
		return err == nil && cp > 0
	}, 30*time.Second, time.Millisecond)
	p2.Kill()
	t.Logf("second projector killed at checkpoint %d of %d", cp, last)

	p3 := start()
	require.Eventually(t, func() bool {
		cp, err = q.Checkpoint(ctx, "")
		return err == nil && cp == last
	}, time.Minute, 10*time.Millisecond, "the projector did not catch up")
	j := requireProjectionMatchesStream(t, b.pool, b.NC)
	requireRowsMatchFold(t, b.pool, j)

	// SIGTERM stops it cleanly.
	require.NoError(t, p3.Term())
	require.Equal(t, 0, exitCode(t, p3), p3.Output())

	// pal projections rebuild makes the same rows.
	live := takeSnapshot(t, b.pool, false)
	rb := testenv.StartProcess(t, bin, []string{"projections", "rebuild"}, env)
	require.Equal(t, 0, exitCode(t, rb), rb.Output())
	require.Contains(t, rb.Output(), "rebuilt the projection of PAL_EVENTS")
	requireSnapshotsEqual(t, live, takeSnapshot(t, b.pool, false))
}
