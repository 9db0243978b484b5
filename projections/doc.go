// Package projections is PAL's read side: it folds the journal in the
// PAL_EVENTS stream into Postgres tables for SQL, the API, the dashboard
// and the recovery sweep. JetStream stays the source of truth; every row
// here is derived from it, may lag it, and can be rebuilt from it
// (docs/architecture.md §13).
//
// # Tables
//
// The migrations are embedded (migrations/*.sql) and applied by Migrate
// (pal migrate, and at the start of pal projector and pal dev), each in its
// own transaction under an advisory lock, recorded in pal_schema_migrations.
//
//	journal_events          every event, once: PK (run_id, seq); kind, step_id, attempt,
//	                        worker_id, data jsonb, stream_seq (its PAL_EVENTS sequence), ts
//	runs                    one row per run: status (queued, running, waiting, succeeded,
//	                        failed, cancelled), workflow snapshot, input, output, parent,
//	                        depth, cost and tokens, error, resumes, timestamps, last_seq
//	steps                   one row per step attempt (the waterfall): PK (run_id, step_id,
//	                        attempt); status (running, completed, failed, retried,
//	                        waiting), input, output, key, tries, usage, timings, last_seq
//	side_effect_receipts    one row per claimed delivery of a step attempt: status
//	                        claimed, delivered, failed or unconfirmed; idempotency_key is unique
//	projection_checkpoints  per projector, the last stream sequence written
//
// Timestamps in projected rows are the events' own (ts), never the time of
// projection, so a rebuild produces identical rows.
//
// # Guarantees
//
// One fold. Status, step and receipt rows come from engine.Fold, the fold
// the workers resume with; events are never interpreted a second way. The
// projector keeps the folded state of active runs in an LRU cache and
// folds a run afresh from its journal in JetStream when its state is not
// cached or its next event is not the one after the state.
//
// Idempotent. The projector reads PAL_EVENTS with the durable pull
// consumer pal-projector. A batch of messages (whatever has arrived while
// the previous batch was being written, up to Config.BatchSize) is written
// in one transaction that also moves the checkpoint (GREATEST, so it never
// moves back); the batch is acknowledged after the commit. Journal rows
// are inserted with ON CONFLICT (run_id, seq) DO NOTHING, and runs, steps
// and receipts rows are upserted only WHERE the stored last_seq is lower.
// Redelivered or replayed messages therefore change nothing. On start the
// durable consumer is put right after the checkpoint in Postgres, so a
// projector killed mid-batch (kill -9) writes that batch again, whole.
//
// Monotonic. A row only moves forward in seq: a run's status is the fold
// of its journal at the row's last_seq, and an older state never
// overwrites a newer one.
//
// Rebuildable. Rebuild replays the whole stream into fresh tables in a
// staging schema and swaps them in atomically, with the checkpoint, while
// the live projector waits on the lock its batches take. The rebuilt rows
// equal the live ones.
//
// Available. Postgres being down stops nothing on the write side: runs go
// on executing, the projector retries its batch with backoff and
// acknowledges nothing until it commits, then catches up. A journal that
// does not fold is logged and counted (Stats) and still gets its journal
// rows; a message that does not verify (event.Chain: not a PAL event, a
// gap, a wrong prev or writer) gets none, is counted, and its run reads
// failed (journal_corrupt). Neither stops the projector. Values Postgres refuses (a NUL character, invalid UTF-8) are
// stored with U+FFFD in their place. NATS going away only pauses the
// consumer, which resumes when the connection is back.
//
// Run one projector per database: two would take turns on the batch lock
// but share one consumer position.
//
// Each committed batch is announced on the Postgres channel
// pal_projections (NotifyChannel) with the new checkpoint as payload, so a
// reader can LISTEN instead of polling.
//
// # Queries
//
// Reader holds the queries PAL itself runs: ListRuns (newest first, with
// a cursor, filtered by a readmodel.RunFilter: labels, status, workflow,
// creation time, error code, the error's text; each filter has an index,
// migration 0013), GetRun (a run with its step attempts,
// ErrRunNotFound) and Orphans (running or queued runs, least recently
// updated first, for the recovery sweep). Users query the tables directly:
//
//	-- runs that failed today, with the failing step
//	SELECT run_id, workflow_name, error_code, failed_step, error
//	FROM runs WHERE status = 'failed' AND updated_at > now() - interval '1 day';
//
//	-- the waterfall of one run
//	SELECT step_id, attempt, status, started_at, ended_at, duration_ms, cost_usd
//	FROM steps WHERE run_id = $1 ORDER BY started_at;
//
//	-- deliveries whose outcome is unknown
//	SELECT run_id, step_id, connector, target, claimed_at
//	FROM side_effect_receipts WHERE status = 'unconfirmed';
//
//	-- runs of one customer, by label (served by runs_labels_idx)
//	SELECT run_id, status, created_at FROM runs WHERE labels @> '{"customer": "acme"}';
//
//	-- the journal of a run, as in the stream
//	SELECT seq, kind, step_id, attempt, data FROM journal_events WHERE run_id = $1 ORDER BY seq;
//
//	-- projection lag, in stream messages (compare with nats stream info PAL_EVENTS)
//	SELECT projector, stream_seq, updated_at FROM projection_checkpoints;
package projections
