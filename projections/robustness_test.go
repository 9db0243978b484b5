package projections_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/projections"
)

// TestRedeliveryChangesNothing projects everything, then makes a new
// projector receive every message again (checkpoint reset to 0, so its
// consumer is put back at the start of the stream) with other batch
// boundaries: no row is rewritten.
func TestRedeliveryChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.projector(t, projections.Config{BatchSize: 7})
	b.worker(t, "w1")
	for _, id := range workload(t, b) {
		b.WaitEnd(t, id)
	}
	caughtUp(t, p)
	before := takeSnapshot(t, b.pool, true)
	checkpoint := takeSnapshot(t, b.pool, false)["projection_checkpoints"]
	stopProjector(t, p)

	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "UPDATE projection_checkpoints SET stream_seq = 0")
	require.NoError(t, err)
	p2 := b.projector(t, projections.Config{BatchSize: 13})
	caughtUp(t, p2)
	require.Equal(t, uint64(len(before["journal_events"])), p2.Stats().Events, "every event came again")

	after := takeSnapshot(t, b.pool, true)
	// Every batch writes the checkpoint row; nothing else was rewritten
	// (same xmin), and the checkpoint is where it was.
	require.Equal(t, checkpoint, takeSnapshot(t, b.pool, false)["projection_checkpoints"])
	delete(before, "projection_checkpoints")
	delete(after, "projection_checkpoints")
	requireSnapshotsEqual(t, before, after)
	requireProjectionMatchesStream(t, b.pool, b.NC)
}

// TestStatusOnlyMovesForward replays the end of a finished run into a
// projector that does not have its state: it folds the run afresh from
// JetStream up to the replayed events, and the older states it computes on
// the way never overwrite the newer row.
func TestStatusOnlyMovesForward(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.projector(t, projections.Config{BatchSize: 1})
	b.worker(t, "w1")
	runID := b.Start(t, seqWorkflow(4, "openai"), `{"topic":"forward"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	caughtUp(t, p)
	before := takeSnapshot(t, b.pool, true)
	stopProjector(t, p)

	// Back to the message before s2 completed.
	var back uint64
	for _, m := range readStream(t, b.JS) {
		for _, e := range m.evs {
			if e.Kind == event.StepCompleted && e.StepID == "s2" {
				back = m.seq - 1
			}
		}
	}
	require.NotZero(t, back)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, "UPDATE projection_checkpoints SET stream_seq = $1", back)
	require.NoError(t, err)

	p2 := b.projector(t, projections.Config{BatchSize: 1})
	caughtUp(t, p2)
	require.Equal(t, uint64(1), p2.Stats().Loads, "the run was folded afresh from JetStream once")
	after := takeSnapshot(t, b.pool, true)
	delete(before, "projection_checkpoints")
	delete(after, "projection_checkpoints")
	requireSnapshotsEqual(t, before, after)
	d, err := projections.NewReader(b.pool).GetRun(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, d.Run.Status)
	j := requireProjectionMatchesStream(t, b.pool, b.NC)
	requireRowsMatchFold(t, b.pool, j)
}

// TestFoldErrorDoesNotStopTheProjector projects a journal the engine
// refuses (a second run_created): its journal rows and the rows of its
// state before the error are written, it is counted, later runs are
// projected, and a rebuild makes the same rows.
func TestFoldErrorDoesNotStopTheProjector(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.projector(t, projections.Config{})
	bad := event.NewRunID()
	created := ev(event.RunCreated, "", 0, event.RunCreatedData{WorkflowName: "broken", Input: json.RawMessage(`{}`)})
	b.AppendRaw(t, bad, created,
		ev(event.RunResumed, "", 0, event.RunResumedData{Worker: "w9", ResumeCount: 1}),
		ev(event.StepStarted, "s1", 1, event.StepStartedData{NodeID: "s1", NodeType: "tool", IdempotencyKey: event.IdempotencyKey(bad, "s1", 1)}),
		created, // seq 4: the engine refuses a second run_created
		ev(event.StepCompleted, "s1", 1, event.StepCompletedData{Output: json.RawMessage(`{"x":1}`)}),
		ev(event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{"x":1}`)}))
	b.worker(t, "w1")
	good := b.Start(t, echoChain(3), `{"v":"after the broken run"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, good).Kind)
	caughtUp(t, p)

	require.Equal(t, uint64(1), p.Stats().FoldErrors)
	requireProjectionMatchesStream(t, b.pool, b.NC)
	j := readJournalOf(t, b, good)
	requireRunMatchesFold(t, b.pool, good, j)
	d, err := projections.NewReader(b.pool).GetRun(context.Background(), bad)
	require.NoError(t, err)
	require.Equal(t, engine.StatusRunning, d.Run.Status)
	require.Equal(t, uint64(3), d.Run.LastSeq, "rows of the state before the error")
	require.Len(t, d.Steps, 1)
	require.Equal(t, engine.StepRunning, d.Steps[0].Status)

	live := takeSnapshot(t, b.pool, false)
	stopProjector(t, p)
	res := rebuild(t, b)
	require.Equal(t, uint64(1), res.FoldErrors)
	requireSnapshotsEqual(t, live, takeSnapshot(t, b.pool, false))
}

func readJournalOf(t *testing.T, b *bundle, runID string) []event.Event {
	t.Helper()
	evs, _, err := b.Store.Read(context.Background(), runID)
	require.NoError(t, err)
	return evs
}

// TestMalformedMessageIsSkipped publishes something that is not a PAL
// event on a run's subject: it is counted and skipped, and what follows is
// projected.
func TestMalformedMessageIsSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t, noJournalCheck())
	p := b.projector(t, projections.Config{})
	ctx := context.Background()
	_, err := b.JS.Publish(ctx, eventstore.EventsSubject("run_garbage"), []byte("not an event"))
	require.NoError(t, err)
	b.worker(t, "w1")
	good := b.Start(t, echoChain(2), `{"v":"x"}`)
	b.WaitEnd(t, good)
	caughtUp(t, p)
	require.Equal(t, uint64(1), p.Stats().Malformed)
	evs := readJournalOf(t, b, good)
	requireRunMatchesFold(t, b.pool, good, evs)
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM journal_events").Scan(&n))
	require.Equal(t, len(evs), n)
	cp, err := projections.NewReader(b.pool).Checkpoint(ctx, "")
	require.NoError(t, err)
	last, err := b.JS.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	require.Equal(t, last.CachedInfo().State.LastSeq, cp)
}

// TestValuesPostgresRefuses projects a run whose data holds a NUL
// character, which jsonb and text refuse: it is stored as U+FFFD instead
// of stopping the projector.
func TestValuesPostgresRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.projector(t, projections.Config{})
	b.worker(t, "w1")
	runID := b.Start(t, echoChain(2), `{"v":"a\u0000b"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	caughtUp(t, p)
	j := requireProjectionMatchesStream(t, b.pool, b.NC)
	requireRowsMatchFold(t, b.pool, j)
	var out string
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT output->>'v' FROM steps WHERE run_id = $1 AND step_id = 't2'", runID).Scan(&out))
	require.Equal(t, "a\uFFFDb", out)
}

// TestPostgresDownWhileRunsExecute stops Postgres while runs execute: the
// runs finish, the projector retries without acknowledging, and once
// Postgres is back it catches up with no row missing or duplicated.
func TestPostgresDownWhileRunsExecute(t *testing.T) {
	t.Parallel()
	b := setup(t, ownPostgres())
	p := b.projector(t, projections.Config{})
	b.worker(t, "w1")
	first := b.Start(t, echoChain(3), `{"v":"before"}`)
	b.WaitEnd(t, first)
	caughtUp(t, p)

	b.pg.StopServer()
	var runs []string
	for range 4 {
		runs = append(runs, b.Start(t, echoChain(40), `{"v":"while Postgres is down"}`))
	}
	for _, id := range runs {
		require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind, "runs finish without Postgres")
	}
	require.Eventually(t, func() bool { return p.Stats().WriteRetries >= 3 }, 30*time.Second, 10*time.Millisecond,
		"the projector tried to write and retries")
	last, err := b.JS.Stream(context.Background(), eventstore.EventsStream)
	require.NoError(t, err)
	require.Less(t, p.Stats().Checkpoint, last.CachedInfo().State.LastSeq, "nothing committed while Postgres is down")

	b.pg.StartServer()
	caughtUp(t, p)
	j := requireProjectionMatchesStream(t, b.pool, b.NC)
	requireRowsMatchFold(t, b.pool, j)
}

// TestNATSRestartWhileProjecting restarts the NATS server while runs
// execute: the projector's connection reconnects, its durable consumer
// carries on, and the projection ends up equal to the stream.
func TestNATSRestartWhileProjecting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.projector(t, projections.Config{})
	b.worker(t, "w1")
	var runs []string
	for range 4 {
		runs = append(runs, b.Start(t, echoChain(40), `{"v":"before the restart"}`))
	}
	require.NoError(t, p.WaitFor(ctxTimeout(t, 30*time.Second), 20))
	b.NATS.Restart(t)
	for range 4 {
		runs = append(runs, b.Start(t, echoChain(10), `{"v":"after the restart"}`))
	}
	for _, id := range runs {
		require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	}
	caughtUp(t, p)
	j := requireProjectionMatchesStream(t, b.pool, b.NC)
	requireRowsMatchFold(t, b.pool, j)
}

// TestStopWhileStartWaits stops a projector whose Start is waiting for an
// unreachable Postgres: Start gives up at once with an error.
func TestStopWhileStartWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://pal@127.0.0.1:1/pal?connect_timeout=1")
	require.NoError(t, err)
	defer pool.Close()
	p := projections.New(pool, b.Store, projections.Config{Logger: paltest.Logger(t)})
	errc := make(chan error, 1)
	go func() { errc <- p.Start(ctx) }()
	require.NoError(t, p.Stop(ctx))
	select {
	case err := <-errc:
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Start kept waiting after Stop")
	}
}

// TestCleanRestartKeepsTheConsumer stops a projector that has caught up
// and starts another: the durable consumer is where the checkpoint says,
// so it is kept, not created again.
func TestCleanRestartKeepsTheConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.projector(t, projections.Config{})
	b.worker(t, "w1")
	id := b.Start(t, echoChain(5), `{"v":"restart"}`)
	b.WaitEnd(t, id)
	caughtUp(t, p)
	stopProjector(t, p)
	ctx := context.Background()
	info := func() *jetstream.ConsumerInfo {
		c, err := b.JS.Consumer(ctx, eventstore.EventsStream, projections.DefaultName)
		require.NoError(t, err)
		ci, err := c.Info(ctx)
		require.NoError(t, err)
		return ci
	}
	// The last ack is asynchronous: wait until the server has it.
	require.Eventually(t, func() bool { return info().AckFloor.Stream == p.Stats().Checkpoint }, 10*time.Second, 5*time.Millisecond)
	before := info().Created

	p2 := b.projector(t, projections.Config{})
	require.Equal(t, before, info().Created, "the consumer was kept")
	id = b.Start(t, echoChain(3), `{"v":"after"}`)
	b.WaitEnd(t, id)
	caughtUp(t, p2)
	j := requireProjectionMatchesStream(t, b.pool, b.NC)
	requireRowsMatchFold(t, b.pool, j)
}
