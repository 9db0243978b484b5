package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/palrun/pal/eventstore"
)

// StagingSchema is where Rebuild builds the new tables before it swaps them
// in. It is dropped when the rebuild ends.
const StagingSchema = "pal_rebuild"

// ErrRebuildRunning is returned by Rebuild when another rebuild of the same
// database is in progress.
var ErrRebuildRunning = errors.New("another projection rebuild is running on this database")

// projectedTables are the tables a rebuild replaces; projection_checkpoints
// stays and gets the rebuilt checkpoint.
var projectedTables = []string{"journal_events", "runs", "steps", "side_effect_receipts"}

// RebuildOptions configure Rebuild.
type RebuildOptions struct {
	// Name is the projector whose checkpoint is set (DefaultName).
	Name string
	// BatchSize caps the messages written per statement batch
	// (DefaultBatchSize).
	BatchSize int
	// CacheSize is how many runs' folded states are kept while replaying
	// (default 100 000).
	CacheSize int
	// Logger receives the rebuild's logs (default slog.Default()).
	Logger *slog.Logger
	// Progress, when set, is called after every batch.
	Progress func(RebuildProgress)
}

// Rebuild phases reported in RebuildProgress.
const (
	PhaseReplay  = "replay"  // replaying the stream into the staging tables
	PhaseCatchUp = "catchup" // replaying the rest while the live projector waits
	PhaseSwap    = "swap"    // swapping the staging tables in
)

// RebuildProgress reports how far a rebuild is.
type RebuildProgress struct {
	Phase string
	// Events counts the journal events written so far.
	Events uint64
	// StreamSeq is the last PAL_EVENTS sequence replayed.
	StreamSeq uint64
	// Target is the stream sequence the phase replays up to.
	Target uint64
}

// RebuildResult says what Rebuild produced.
type RebuildResult struct {
	// Events counts the journal events replayed.
	Events uint64
	// Rows in the rebuilt tables.
	JournalRows, Runs, Steps, Receipts int64
	// StreamSeq is the checkpoint the rebuilt tables carry.
	StreamSeq uint64
	// FoldErrors counts runs whose journal did not fold (logged).
	FoldErrors uint64
	Duration   time.Duration
}

// Rebuild replays PAL_EVENTS from its first message into fresh tables and
// swaps them in for the live ones. The live projector may keep running:
//
//  1. the migrations are applied to the live schema and to StagingSchema,
//     created afresh;
//  2. the stream is replayed into the staging tables with the same fold
//     and the same batch writes as the live projector, until it is nearly
//     caught up;
//  3. in one transaction that holds the lock every live batch takes, the
//     rest of the stream (up to its last sequence at that moment) is
//     replayed, the live journal_events, runs, steps and
//     side_effect_receipts are dropped, the staging ones moved into their
//     place and the projector's checkpoint set to the last sequence
//     replayed.
//
// A live batch waiting on the lock then writes into the new tables, where
// it changes nothing it should not (the writes are idempotent and guarded
// by last_seq). Readers see the old tables or the new ones, never a mix.
// Grants on the old tables are not carried over.
//
// Errors: ErrRebuildRunning; the database's and JetStream's. On error the
// live tables are untouched and the staging schema is dropped.
func Rebuild(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, opts RebuildOptions) (RebuildResult, error) {
	start := time.Now()
	if opts.Name == "" {
		opts.Name = DefaultName
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = 100_000
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	log := opts.Logger.With("rebuild", opts.Name)
	var res RebuildResult

	store, err := eventstore.Open(ctx, js)
	if err != nil {
		return res, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("rebuild: connecting to Postgres: %w", err)
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", lockRebuild).Scan(&locked); err != nil {
		return res, fmt.Errorf("rebuild: %w", err)
	}
	if !locked {
		return res, ErrRebuildRunning
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockRebuild)
	}()

	if _, err := Migrate(ctx, pool); err != nil {
		return res, fmt.Errorf("rebuild: %w", err)
	}
	var live string
	if err := conn.QueryRow(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass('journal_events')`).Scan(&live); err != nil {
		return res, fmt.Errorf("rebuild: finding the live tables: %w", err)
	}
	if live == StagingSchema {
		return res, fmt.Errorf("rebuild: the live tables are in schema %s, which rebuild uses for staging", StagingSchema)
	}
	staging := pgx.Identifier{StagingSchema}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+staging+" CASCADE"); err != nil {
		return res, fmt.Errorf("rebuild: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+staging); err != nil {
		return res, fmt.Errorf("rebuild: creating schema %s: %w", StagingSchema, err)
	}
	swapped := false
	defer func() {
		if !swapped {
			if _, err := conn.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+staging+" CASCADE"); err != nil {
				log.Warn("dropping the staging schema", "schema", StagingSchema, "err", err)
			}
		}
	}()
	if _, err := migrate(ctx, pool, StagingSchema); err != nil {
		return res, fmt.Errorf("rebuild: %w", err)
	}

	cons, err := js.OrderedConsumer(ctx, eventstore.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{eventstore.EventsPrefix + "*"},
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return res, fmt.Errorf("rebuild: reading %s: %w", eventstore.EventsStream, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * opts.BatchSize))
	if err != nil {
		return res, fmt.Errorf("rebuild: reading %s: %w", eventstore.EventsStream, err)
	}
	defer it.Stop()
	var stats counters
	r := &replayer{
		it:   it,
		w:    newWriter(StagingSchema),
		opts: opts,
		f:    &folder{cache: newStateCache(opts.CacheSize), log: log, stats: &stats, scan: store.ScanStamped, earlier: store.Earlier, resolve: store.ResolveBlobs},
	}

	// Replay without holding anything, until what is left is small.
	for round := 0; ; round++ {
		target, err := streamLastSeq(ctx, js)
		if err != nil {
			return res, fmt.Errorf("rebuild: %w", err)
		}
		if target <= r.seq+uint64(2*opts.BatchSize) || round == 5 {
			break
		}
		if err := r.replayTo(ctx, pool, target, PhaseReplay); err != nil {
			return res, err
		}
	}

	// Catch up and swap while live batches wait.
	tx, err := conn.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("rebuild: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '60s'"); err != nil {
		return res, fmt.Errorf("rebuild: %w", err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockBatch); err != nil {
		return res, fmt.Errorf("rebuild: waiting for the live projector's batch: %w", err)
	}
	target, err := streamLastSeq(ctx, js)
	if err != nil {
		return res, fmt.Errorf("rebuild: %w", err)
	}
	if err := r.replayTo(ctx, tx, target, PhaseCatchUp); err != nil {
		return res, err
	}
	r.progress(PhaseSwap, r.seq, target)
	if err := keepRetained(ctx, tx, live); err != nil {
		return res, err
	}
	liveID := pgx.Identifier{live}.Sanitize()
	for _, t := range projectedTables {
		if _, err := tx.Exec(ctx, "DROP TABLE "+qualify(live, t)); err != nil {
			return res, fmt.Errorf("rebuild: dropping the live %s: %w", t, err)
		}
		if _, err := tx.Exec(ctx, "ALTER TABLE "+qualify(StagingSchema, t)+" SET SCHEMA "+liveID); err != nil {
			return res, fmt.Errorf("rebuild: moving the rebuilt %s in: %w", t, err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+qualify(live, "projection_checkpoints")+` (projector, stream_seq, updated_at)
		VALUES ($1, $2, now()) ON CONFLICT (projector) DO UPDATE SET stream_seq = EXCLUDED.stream_seq, updated_at = now()`,
		opts.Name, int64(r.seq)); err != nil {
		return res, fmt.Errorf("rebuild: setting the checkpoint: %w", err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", NotifyChannel, strconv.FormatUint(r.seq, 10)); err != nil {
		return res, fmt.Errorf("rebuild: %w", err)
	}
	if _, err := tx.Exec(ctx, "DROP SCHEMA "+staging+" CASCADE"); err != nil {
		return res, fmt.Errorf("rebuild: dropping the staging schema: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("rebuild: swapping the tables in: %w", err)
	}
	swapped = true

	res.Events, res.StreamSeq, res.FoldErrors = r.events, r.seq, stats.foldErrors.Load()
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM journal_events), (SELECT count(*) FROM runs),
		(SELECT count(*) FROM steps), (SELECT count(*) FROM side_effect_receipts)`).
		Scan(&res.JournalRows, &res.Runs, &res.Steps, &res.Receipts); err != nil {
		return res, fmt.Errorf("rebuild: counting rows: %w", err)
	}
	res.Duration = time.Since(start)
	log.Info("projection rebuilt", "events", res.Events, "runs", res.Runs, "checkpoint", res.StreamSeq, "took", res.Duration)
	return res, nil
}

// replayer replays the stream in order into the staging tables. Within
// replayTo, seq belongs to the reading goroutine and events to the
// writing one.
type replayer struct {
	it     jetstream.MessagesContext
	w      *writer
	f      *folder
	opts   RebuildOptions
	seq    uint64 // last stream sequence read
	events uint64 // journal events written
}

// replayTo replays messages until stream sequence target, in batches
// written through db: one goroutine reads and decodes, one folds, one
// writes, so the three overlap.
func (r *replayer) replayTo(ctx context.Context, db sender, target uint64, phase string) error {
	if r.seq >= target {
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	chunks := make(chan []decoded, 1)
	work := make(chan *batch, 1)
	g.Go(func() error {
		defer close(chunks)
		for r.seq < target {
			dec := make([]decoded, 0, r.opts.BatchSize)
			for len(dec) < r.opts.BatchSize && r.seq < target {
				m, err := r.it.Next(jetstream.NextContext(gctx))
				if err != nil {
					return fmt.Errorf("rebuild: reading %s at seq %d: %w", eventstore.EventsStream, r.seq+1, err)
				}
				md, err := m.Metadata()
				if err != nil {
					return fmt.Errorf("rebuild: reading %s at seq %d: %w", eventstore.EventsStream, r.seq+1, err)
				}
				r.seq = md.Sequence.Stream
				d, ok := decodedOf(r.seq, m.Subject(), m.Data(), m.Headers())
				if !ok {
					r.f.log.Error("skipping a message off the runs' subjects", "stream_seq", r.seq, "subject", m.Subject())
					d = decoded{streamSeq: r.seq}
				}
				dec = append(dec, d)
			}
			select {
			case chunks <- dec:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	g.Go(func() error {
		defer close(work)
		for dec := range chunks {
			pb := newPending()
			if err := r.f.fold(gctx, pb, dec); err != nil {
				return fmt.Errorf("rebuild: %w", err)
			}
			select {
			case work <- r.f.rows(pb):
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	g.Go(func() error {
		for b := range work {
			if err := r.w.write(gctx, db, b, writeOpts{projector: r.opts.Name}); err != nil {
				return fmt.Errorf("rebuild: writing stream seq ≤ %d: %w", b.lastStreamSeq, err)
			}
			r.events += uint64(len(b.journal))
			r.progress(phase, b.lastStreamSeq, target)
		}
		return nil
	})
	return g.Wait()
}

func (r *replayer) progress(phase string, seq, target uint64) {
	if r.opts.Progress != nil {
		r.opts.Progress(RebuildProgress{Phase: phase, Events: r.events, StreamSeq: seq, Target: target})
	}
}

// retainedTables are the rows a run whose journal retention removed
// keeps; a rebuild cannot replay them, so it copies them over.
var retainedTables = []string{"runs", "steps", "side_effect_receipts"}

// keepRetained copies the rows of the runs whose journal retention
// removed (runs.journal_removed_at) from the live tables into the staging
// ones, in the swap transaction (under the batch lock, which retention's
// mark takes too).
func keepRetained(ctx context.Context, tx pgx.Tx, live string) error {
	for _, t := range retainedTables {
		var cols string
		// Generated columns (runs.cost, runs.tokens) cannot be inserted.
		if err := tx.QueryRow(ctx, `SELECT string_agg(quote_ident(column_name), ', ' ORDER BY ordinal_position)
			FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 AND is_generated = 'NEVER'`,
			StagingSchema, t).Scan(&cols); err != nil {
			return fmt.Errorf("rebuild: listing the columns of %s: %w", t, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+qualify(StagingSchema, t)+" ("+cols+") SELECT "+cols+" FROM "+qualify(live, t)+
			" WHERE run_id IN (SELECT run_id FROM "+qualify(live, "runs")+" WHERE journal_removed_at IS NOT NULL) ON CONFLICT DO NOTHING"); err != nil {
			return fmt.Errorf("rebuild: keeping the rows of runs whose journal retention removed (%s): %w", t, err)
		}
	}
	return nil
}
