package projections

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/readmodel"
)

// NotifyChannel is the Postgres channel on which the live projector
// announces each committed batch (LISTEN pal_projections); the payload is
// the new checkpoint, a PAL_EVENTS stream sequence in decimal.
const NotifyChannel = "pal_projections"

// sender is what a batch is written through: a pool (each batch an
// implicit transaction) or an open transaction.
type sender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// writer writes batches into the tables of one schema.
type writer struct {
	journal, runs, steps, receipts, checkpoint string
}

// newWriter returns a writer for the tables in schema ("" for the tables
// the connection's search_path finds).
func newWriter(schema string) *writer {
	q := func(t string) string { return qualify(schema, t) }
	return &writer{
		journal: fmt.Sprintf(`INSERT INTO %s (run_id, seq, kind, step_id, attempt, worker_id, data, stream_seq, ts)
SELECT run_id, seq, kind, NULLIF(step_id, ''), NULLIF(attempt, 0), worker_id, data, stream_seq, ts
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::integer[], $6::text[], $7::jsonb[], $8::bigint[], $9::timestamptz[])
  AS u(run_id, seq, kind, step_id, attempt, worker_id, data, stream_seq, ts)
ON CONFLICT (run_id, seq) DO NOTHING`, q("journal_events")),

		runs: fmt.Sprintf(`INSERT INTO %s AS r (run_id, status, workflow_name, workflow, workflow_hash, input, output,
  parent_run_id, parent_step_id, depth, cost_usd, input_tokens, output_tokens, total_tokens,
  error, error_code, failed_step, resumes, last_worker, created_at, updated_at, ended_at, last_seq,
  budget, steps_spent, paused_on, cost_unknown, forked_from, cache_read_tokens, cache_write_tokens, reasoning_tokens, labels, queue, schedule, tick, thread)
SELECT run_id, status, NULLIF(workflow_name, ''), workflow, NULLIF(workflow_hash, ''), input, output,
  NULLIF(parent_run_id, ''), NULLIF(parent_step_id, ''), depth, cost_usd, input_tokens, output_tokens, total_tokens,
  NULLIF(error, ''), NULLIF(error_code, ''), NULLIF(failed_step, ''), resumes, NULLIF(last_worker, ''),
  created_at, updated_at, ended_at, last_seq, budget, steps_spent, NULLIF(paused_on, ''), cost_unknown, forked_from,
  cache_read_tokens, cache_write_tokens, reasoning_tokens, labels, queue, NULLIF(schedule, ''), tick, NULLIF(thread, '')
FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $6::jsonb[], $7::jsonb[],
  $8::text[], $9::text[], $10::integer[], $11::float8[], $12::bigint[], $13::bigint[], $14::bigint[],
  $15::text[], $16::text[], $17::text[], $18::integer[], $19::text[], $20::timestamptz[], $21::timestamptz[],
  $22::timestamptz[], $23::bigint[], $24::jsonb[], $25::bigint[], $26::text[], $27::boolean[], $28::jsonb[],
  $29::bigint[], $30::bigint[], $31::bigint[], $32::jsonb[], $33::text[], $34::text[], $35::timestamptz[], $36::text[])
  AS u(run_id, status, workflow_name, workflow, workflow_hash, input, output,
  parent_run_id, parent_step_id, depth, cost_usd, input_tokens, output_tokens, total_tokens,
  error, error_code, failed_step, resumes, last_worker, created_at, updated_at, ended_at, last_seq,
  budget, steps_spent, paused_on, cost_unknown, forked_from, cache_read_tokens, cache_write_tokens, reasoning_tokens, labels, queue, schedule, tick, thread)
ON CONFLICT (run_id) DO UPDATE SET
  status = EXCLUDED.status, workflow_name = EXCLUDED.workflow_name,
  workflow = COALESCE(EXCLUDED.workflow, r.workflow), workflow_hash = EXCLUDED.workflow_hash,
  input = COALESCE(EXCLUDED.input, r.input), output = EXCLUDED.output,
  parent_run_id = EXCLUDED.parent_run_id, parent_step_id = EXCLUDED.parent_step_id, depth = EXCLUDED.depth,
  cost_usd = EXCLUDED.cost_usd, input_tokens = EXCLUDED.input_tokens, output_tokens = EXCLUDED.output_tokens,
  total_tokens = EXCLUDED.total_tokens, error = EXCLUDED.error, error_code = EXCLUDED.error_code,
  failed_step = EXCLUDED.failed_step, resumes = EXCLUDED.resumes, last_worker = EXCLUDED.last_worker,
  created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at, ended_at = EXCLUDED.ended_at,
  last_seq = EXCLUDED.last_seq, budget = EXCLUDED.budget, steps_spent = EXCLUDED.steps_spent,
  paused_on = EXCLUDED.paused_on, cost_unknown = EXCLUDED.cost_unknown, forked_from = EXCLUDED.forked_from,
  cache_read_tokens = EXCLUDED.cache_read_tokens, cache_write_tokens = EXCLUDED.cache_write_tokens,
  reasoning_tokens = EXCLUDED.reasoning_tokens, labels = EXCLUDED.labels, queue = EXCLUDED.queue,
  schedule = EXCLUDED.schedule, tick = EXCLUDED.tick, thread = EXCLUDED.thread
WHERE r.last_seq < EXCLUDED.last_seq`, q("runs")),

		steps: fmt.Sprintf(`INSERT INTO %s AS s (run_id, step_id, attempt, node_id, node_type, status, input, output,
  error, error_class, idempotency_key, tries, input_tokens, output_tokens, cost_usd, delivery,
  started_at, ended_at, duration_ms, last_seq, first_seq, waiting_at, substeps, cost_unknown, copied_from,
  cache_read_tokens, cache_write_tokens, reasoning_tokens, model)
SELECT run_id, step_id, attempt, NULLIF(node_id, ''), NULLIF(node_type, ''), status, input, output,
  NULLIF(error, ''), NULLIF(error_class, ''), NULLIF(idempotency_key, ''), tries, input_tokens, output_tokens,
  cost_usd, NULLIF(delivery, ''), started_at, ended_at, duration_ms, last_seq, first_seq, waiting_at, substeps, cost_unknown, copied_from,
  cache_read_tokens, cache_write_tokens, reasoning_tokens, NULLIF(model, '')
FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::text[], $7::jsonb[], $8::jsonb[],
  $9::text[], $10::text[], $11::text[], $12::integer[], $13::bigint[], $14::bigint[], $15::float8[], $16::text[],
  $17::timestamptz[], $18::timestamptz[], $19::bigint[], $20::bigint[], $21::bigint[], $22::timestamptz[], $23::jsonb[], $24::boolean[], $25::jsonb[],
  $26::bigint[], $27::bigint[], $28::bigint[], $29::text[])
  AS u(run_id, step_id, attempt, node_id, node_type, status, input, output,
  error, error_class, idempotency_key, tries, input_tokens, output_tokens, cost_usd, delivery,
  started_at, ended_at, duration_ms, last_seq, first_seq, waiting_at, substeps, cost_unknown, copied_from,
  cache_read_tokens, cache_write_tokens, reasoning_tokens, model)
ON CONFLICT (run_id, step_id, attempt) DO UPDATE SET
  node_id = EXCLUDED.node_id, node_type = EXCLUDED.node_type, status = EXCLUDED.status,
  input = EXCLUDED.input, output = EXCLUDED.output, error = EXCLUDED.error, error_class = EXCLUDED.error_class,
  idempotency_key = EXCLUDED.idempotency_key, tries = EXCLUDED.tries, input_tokens = EXCLUDED.input_tokens,
  output_tokens = EXCLUDED.output_tokens, cost_usd = EXCLUDED.cost_usd, delivery = EXCLUDED.delivery,
  started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at, duration_ms = EXCLUDED.duration_ms,
  last_seq = EXCLUDED.last_seq, first_seq = EXCLUDED.first_seq, waiting_at = EXCLUDED.waiting_at,
  substeps = EXCLUDED.substeps, cost_unknown = EXCLUDED.cost_unknown, copied_from = EXCLUDED.copied_from,
  cache_read_tokens = EXCLUDED.cache_read_tokens, cache_write_tokens = EXCLUDED.cache_write_tokens,
  reasoning_tokens = EXCLUDED.reasoning_tokens, model = EXCLUDED.model
WHERE s.last_seq < EXCLUDED.last_seq`, q("steps")),

		// A key that another attempt already holds is not projected a
		// second time: keys derive from (run, step, attempt), so only a
		// broken journal can repeat one, and that must not stop the
		// projector on a unique violation.
		receipts: fmt.Sprintf(`INSERT INTO %[1]s AS x (run_id, step_id, attempt, idempotency_key, connector, target,
  status, http_status, claimed_at, delivered_at, last_seq)
SELECT u.run_id, u.step_id, u.attempt, NULLIF(u.idempotency_key, ''), NULLIF(u.connector, ''), NULLIF(u.target, ''),
  u.status, NULLIF(u.http_status, 0), u.claimed_at, u.delivered_at, u.last_seq
FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::text[], $7::text[], $8::integer[],
  $9::timestamptz[], $10::timestamptz[], $11::bigint[])
  AS u(run_id, step_id, attempt, idempotency_key, connector, target, status, http_status, claimed_at, delivered_at, last_seq)
WHERE NOT EXISTS (SELECT 1 FROM %[1]s o WHERE o.idempotency_key = NULLIF(u.idempotency_key, '')
  AND (o.run_id, o.step_id, o.attempt) <> (u.run_id, u.step_id, u.attempt))
ON CONFLICT (run_id, step_id, attempt) DO UPDATE SET
  idempotency_key = EXCLUDED.idempotency_key, connector = EXCLUDED.connector, target = EXCLUDED.target,
  status = EXCLUDED.status, http_status = EXCLUDED.http_status, claimed_at = EXCLUDED.claimed_at,
  delivered_at = EXCLUDED.delivered_at, last_seq = EXCLUDED.last_seq
WHERE x.last_seq < EXCLUDED.last_seq`, q("side_effect_receipts")),

		checkpoint: fmt.Sprintf(`INSERT INTO %[1]s AS c (projector, stream_seq, updated_at) VALUES ($1, $2, now())
ON CONFLICT (projector) DO UPDATE SET stream_seq = GREATEST(c.stream_seq, EXCLUDED.stream_seq), updated_at = now()`,
			q("projection_checkpoints")),
	}
}

// writeOpts say how a batch is written.
type writeOpts struct {
	// projector names the checkpoint row.
	projector string
	// lock takes the batch lock first (the live projector; a rebuild's
	// swap transaction already holds it).
	lock bool
	// notify announces the commit on NotifyChannel.
	notify bool
}

// queue adds b's statements to pb.
func (w *writer) queue(pb *pgx.Batch, b *batch, o writeOpts) {
	if o.lock {
		pb.Queue("SELECT pg_advisory_xact_lock($1)", lockBatch)
	}
	if len(b.journal) > 0 {
		pb.Queue(w.journal, journalColumns(b.journal)...)
	}
	if len(b.runs) > 0 {
		pb.Queue(w.runs, runColumns(b.runs)...)
	}
	if len(b.steps) > 0 {
		pb.Queue(w.steps, stepColumns(b.steps)...)
	}
	if len(b.receipts) > 0 {
		pb.Queue(w.receipts, receiptColumns(b.receipts)...)
	}
	if b.lastStreamSeq > 0 {
		pb.Queue(w.checkpoint, o.projector, int64(b.lastStreamSeq))
		if o.notify {
			pb.Queue("SELECT pg_notify($1, $2)", NotifyChannel, strconv.FormatUint(b.lastStreamSeq, 10))
		}
	}
}

// write sends b in one round trip. Through a pool the statements run in
// one implicit transaction: all of the batch commits, or none of it.
func (w *writer) write(ctx context.Context, db sender, b *batch, o writeOpts) error {
	pb := &pgx.Batch{}
	w.queue(pb, b, o)
	if pb.Len() == 0 {
		return nil
	}
	return db.SendBatch(ctx, pb).Close()
}

func journalColumns(rows []journalRow) []any {
	n := len(rows)
	var (
		run, kind, step, worker = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		seq, sseq               = make([]int64, n), make([]int64, n)
		attempt                 = make([]int32, n)
		data                    = make([][]byte, n)
		ts                      = make([]time.Time, n)
	)
	for i, r := range rows {
		run[i], seq[i], kind[i], step[i] = cleanText(r.RunID), int64(r.Seq), cleanText(r.Kind), cleanText(r.StepID)
		attempt[i], worker[i], data[i] = int32Of(r.Attempt), cleanText(r.WorkerID), cleanJSON(r.Data)
		if data[i] == nil {
			data[i] = []byte("{}")
		}
		sseq[i], ts[i] = int64(r.StreamSeq), r.TS
	}
	return []any{run, seq, kind, step, attempt, worker, data, sseq, ts}
}

func runColumns(rows []readmodel.RunRow) []any {
	n := len(rows)
	var (
		id, status, name, hash, parent, parentStep = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		errs, code, failed, worker                 = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		wf, input, output, budget                  = make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n)
		paused                                     = make([]string, n)
		steps                                      = make([]int64, n)
		depth, resumes                             = make([]int32, n), make([]int32, n)
		cost                                       = make([]float64, n)
		in, out, total, last                       = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		created, updated                           = make([]time.Time, n), make([]time.Time, n)
		ended                                      = make([]pgtype.Timestamptz, n)
		unknown                                    = make([]bool, n)
		forked, labels                             = make([][]byte, n), make([][]byte, n)
		queue                                      = make([]string, n)
		thread                                     = make([]string, n)
		cacheRead, cacheWrite, reasoning           = make([]int64, n), make([]int64, n), make([]int64, n)
		schedule                                   = make([]string, n)
		tick                                       = make([]pgtype.Timestamptz, n)
	)
	for i, r := range rows {
		id[i], status[i], name[i], hash[i] = cleanText(r.RunID), string(r.Status), cleanText(r.WorkflowName), cleanText(r.WorkflowHash)
		wf[i], input[i], output[i] = cleanJSON(r.Workflow), cleanJSON(r.Input), cleanJSON(r.Output)
		parent[i], parentStep[i], depth[i] = cleanText(r.ParentRunID), cleanText(r.ParentStepID), int32Of(r.Depth)
		cost[i], in[i], out[i], total[i] = r.CostUSD, r.InputTokens, r.OutputTokens, r.TotalTokens
		errs[i], code[i], failed[i] = cleanText(r.Error), cleanText(r.ErrorCode), cleanText(r.FailedStep)
		resumes[i], worker[i] = int32Of(r.Resumes), cleanText(r.LastWorker)
		created[i], updated[i], ended[i], last[i] = r.CreatedAt, r.UpdatedAt, tstz(r.EndedAt), int64(r.LastSeq)
		budget[i], steps[i], paused[i] = cleanJSON(r.Budget), r.StepsSpent, cleanText(r.PausedOn)
		unknown[i], forked[i], labels[i] = r.CostUnknown, cleanJSON(r.ForkedFrom), labelsJSON(r.Labels)
		cacheRead[i], cacheWrite[i], reasoning[i] = r.CacheReadTokens, r.CacheWriteTokens, r.ReasoningTokens
		queue[i] = cleanText(event.QueueOr(r.Queue))
		schedule[i], tick[i] = cleanText(r.Schedule), tstz(r.Tick)
		thread[i] = cleanText(r.Thread)
	}
	return []any{id, status, name, wf, hash, input, output, parent, parentStep, depth, cost, in, out, total,
		errs, code, failed, resumes, worker, created, updated, ended, last, budget, steps, paused, unknown, forked,
		cacheRead, cacheWrite, reasoning, labels, queue, schedule, tick, thread}
}

func stepColumns(rows []readmodel.StepRow) []any {
	n := len(rows)
	var (
		run, step, node, typ, status = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		errs, class, key, delivery   = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		attempt, tries               = make([]int32, n), make([]int32, n)
		input, output, substeps      = make([][]byte, n), make([][]byte, n), make([][]byte, n)
		copied                       = make([][]byte, n)
		in, out, dur, last, first    = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		cost                         = make([]float64, n)
		started, ended, waiting      = make([]pgtype.Timestamptz, n), make([]pgtype.Timestamptz, n), make([]pgtype.Timestamptz, n)
		unknown                      = make([]bool, n)
		cacheRead, cacheWrite        = make([]int64, n), make([]int64, n)
		reasoning                    = make([]int64, n)
		model                        = make([]string, n)
	)
	for i, r := range rows {
		run[i], step[i], attempt[i] = cleanText(r.RunID), cleanText(r.StepID), int32(r.Attempt)
		cacheRead[i], cacheWrite[i], reasoning[i], model[i] = r.CacheReadTokens, r.CacheWriteTokens, r.ReasoningTokens, cleanText(r.Model)
		node[i], typ[i], status[i] = cleanText(r.NodeID), cleanText(r.NodeType), cleanText(string(r.Status))
		input[i], output[i] = cleanJSON(r.Input), cleanJSON(r.Output)
		errs[i], class[i], key[i], tries[i] = cleanText(r.Error), cleanText(r.ErrorClass), cleanText(r.IdempotencyKey), int32Of(r.Tries)
		in[i], out[i], cost[i], delivery[i] = r.InputTokens, r.OutputTokens, r.CostUSD, cleanText(r.Delivery)
		started[i], ended[i], dur[i], last[i] = tstz(r.StartedAt), tstz(r.EndedAt), r.DurationMs, int64(r.LastSeq)
		first[i], waiting[i], substeps[i], unknown[i] = int64(r.FirstSeq), tstz(r.WaitingAt), cleanJSON(r.Substeps), r.CostUnknown
		copied[i] = cleanJSON(r.CopiedFrom)
	}
	return []any{run, step, attempt, node, typ, status, input, output, errs, class, key, tries, in, out, cost,
		delivery, started, ended, dur, last, first, waiting, substeps, unknown, copied, cacheRead, cacheWrite, reasoning, model}
}

func receiptColumns(rows []readmodel.ReceiptRow) []any {
	n := len(rows)
	var (
		run, step, key, conn, target, status = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		attempt, code                        = make([]int32, n), make([]int32, n)
		claimed, delivered                   = make([]pgtype.Timestamptz, n), make([]pgtype.Timestamptz, n)
		last                                 = make([]int64, n)
	)
	for i, r := range rows {
		run[i], step[i], attempt[i], key[i] = cleanText(r.RunID), cleanText(r.StepID), int32(r.Attempt), cleanText(r.IdempotencyKey)
		conn[i], target[i], status[i], code[i] = cleanText(r.Connector), cleanText(r.Target), r.Status, int32Of(r.HTTPStatus)
		claimed[i], delivered[i], last[i] = tstz(r.ClaimedAt), tstz(r.DeliveredAt), int64(r.LastSeq)
	}
	return []any{run, step, attempt, key, conn, target, status, code, claimed, delivered, last}
}

// labelsJSON is the runs.labels of a run: its labels, {} for none.
func labelsJSON(labels map[string]string) []byte {
	if len(labels) == 0 {
		return []byte("{}")
	}
	b, err := json.Marshal(labels)
	if err != nil {
		return []byte("{}") // a map of strings always marshals
	}
	return cleanJSON(b)
}

// tstz is t, or NULL when t is zero.
func tstz(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}
