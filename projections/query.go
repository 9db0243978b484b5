package projections

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/readmodel"
)

// ErrRunNotFound is returned by GetRun for a run the projection does not
// hold. It is eventstore.ErrRunNotFound, so callers test one error
// whichever side answered.
var ErrRunNotFound = eventstore.ErrRunNotFound

// ErrBadCursor is returned by ListRuns for a cursor it did not issue.
var ErrBadCursor = readmodel.ErrBadCursor

// Reader runs the read queries of the CLI, the API and the recovery sweep
// against the projection.
type Reader struct {
	pool *pgxpool.Pool
}

// NewReader returns a Reader over pool.
func NewReader(pool *pgxpool.Pool) *Reader { return &Reader{pool: pool} }

// DefaultListLimit and MaxListLimit bound RunFilter.Limit.
const (
	DefaultListLimit = readmodel.DefaultListLimit
	MaxListLimit     = readmodel.MaxListLimit
)

// RunFilter selects runs for ListRuns.
type RunFilter = readmodel.RunFilter

const runColumnsSQL = `run_id, status, COALESCE(workflow_name, ''), COALESCE(workflow_hash, ''), input, output,
	COALESCE(parent_run_id, ''), COALESCE(parent_step_id, ''), depth, cost_usd, input_tokens, output_tokens, total_tokens,
	COALESCE(error, ''), COALESCE(error_code, ''), COALESCE(failed_step, ''), resumes, COALESCE(last_worker, ''),
	created_at, updated_at, ended_at, last_seq, budget, steps_spent, COALESCE(paused_on, ''), cost_unknown, journal_removed_at, forked_from,
	cache_read_tokens, cache_write_tokens, reasoning_tokens, labels, queue, COALESCE(schedule, ''), tick, COALESCE(thread, '')`

func scanRun(row pgx.Row, extra ...any) (readmodel.RunRow, error) {
	var (
		r              readmodel.RunRow
		status         string
		input, output  []byte
		budget         []byte
		depth, resumes int32
		ended, removed pgtype.Timestamptz
		tick           pgtype.Timestamptz
		last           int64
	)
	dest := append([]any{&r.RunID, &status, &r.WorkflowName, &r.WorkflowHash, &input, &output,
		&r.ParentRunID, &r.ParentStepID, &depth, &r.CostUSD, &r.InputTokens, &r.OutputTokens, &r.TotalTokens,
		&r.Error, &r.ErrorCode, &r.FailedStep, &resumes, &r.LastWorker,
		&r.CreatedAt, &r.UpdatedAt, &ended, &last, &budget, &r.StepsSpent, &r.PausedOn, &r.CostUnknown, &removed, &r.ForkedFrom,
		&r.CacheReadTokens, &r.CacheWriteTokens, &r.ReasoningTokens, &r.Labels, &r.Queue, &r.Schedule, &tick, &r.Thread}, extra...)
	if err := row.Scan(dest...); err != nil {
		return r, err
	}
	r.Status, r.Input, r.Output, r.Budget = engine.Status(status), input, output, budget
	r.Depth, r.Resumes, r.LastSeq = int(depth), int(resumes), uint64(last)
	if ended.Valid {
		r.EndedAt = ended.Time
	}
	if removed.Valid {
		r.JournalRemovedAt = removed.Time
	}
	if tick.Valid {
		r.Tick = tick.Time.UTC()
	}
	return r, nil
}

// ListRuns returns runs, newest first (by creation time, then run id),
// without their workflow snapshots. Each filter of f is served by an
// index (migrations 0013, 0015). Errors: ErrBadCursor.
func (q *Reader) ListRuns(ctx context.Context, f RunFilter) ([]readmodel.RunRow, error) {
	sql, args, err := listQuery(f)
	if err != nil {
		return nil, err
	}
	rows, err := q.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("listing runs: %w", err)
	}
	defer rows.Close()
	var out []readmodel.RunRow
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("listing runs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing runs: %w", err)
	}
	return out, nil
}

// listQuery is the SQL and arguments of ListRuns(f).
func listQuery(f RunFilter) (string, []any, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	limit = min(limit, MaxListLimit)
	var (
		where []string
		args  []any
	)
	add := func(cond string, vs ...any) {
		args = append(args, vs...)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if f.Status != "" {
		add("status = $%d", string(f.Status))
	}
	if f.Workflow != "" {
		add("workflow_name = $%d", f.Workflow)
	}
	if f.Queue != "" {
		add("queue = $%d", f.Queue)
	}
	if f.Schedule != "" {
		add("schedule = $%d", f.Schedule)
	}
	if f.Thread != "" {
		add("thread = $%d", f.Thread)
	}
	if len(f.Labels) > 0 {
		labels, err := json.Marshal(f.Labels)
		if err != nil {
			return "", nil, fmt.Errorf("listing runs: the label filter: %w", err)
		}
		add("labels @> $%d::jsonb", labels)
	}
	if !f.Since.IsZero() {
		add("created_at >= $%d", f.Since)
	}
	if !f.Until.IsZero() {
		add("created_at < $%d", f.Until)
	}
	if f.ErrorCode != "" {
		add("error_code = $%d", f.ErrorCode)
	}
	if f.Text != "" {
		add("error ILIKE $%d", "%"+likeEscaper.Replace(f.Text)+"%")
	}
	if f.Before != "" {
		ts, id, err := readmodel.ParseCursor(f.Before)
		if err != nil {
			return "", nil, err
		}
		args = append(args, ts, id)
		where = append(where, fmt.Sprintf("(created_at, run_id) < ($%d, $%d)", len(args)-1, len(args)))
	}
	sql := "SELECT " + runColumnsSQL + " FROM runs"
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, limit)
	sql += fmt.Sprintf(" ORDER BY created_at DESC, run_id DESC LIMIT $%d", len(args))
	return sql, args, nil
}

// likeEscaper makes text match itself in a LIKE pattern (whose escape
// character is the backslash).
var likeEscaper = strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`)

// GetRun returns a run, its workflow snapshot and its step attempts.
// Errors: ErrRunNotFound.
func (q *Reader) GetRun(ctx context.Context, runID string) (readmodel.RunDetail, error) {
	var d readmodel.RunDetail
	var wf []byte
	r, err := scanRun(q.pool.QueryRow(ctx, "SELECT "+runColumnsSQL+", workflow FROM runs WHERE run_id = $1", runID), &wf)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("run %s: %w", runID, ErrRunNotFound)
	}
	if err != nil {
		return d, fmt.Errorf("reading run %s: %w", runID, err)
	}
	r.Workflow = wf
	d.Run = r
	if d.Steps, err = q.steps(ctx, runID); err != nil {
		return d, err
	}
	return d, nil
}

func (q *Reader) steps(ctx context.Context, runID string) ([]readmodel.StepRow, error) {
	rows, err := q.pool.Query(ctx, `SELECT run_id, step_id, attempt, COALESCE(node_id, ''), COALESCE(node_type, ''), status,
		input, output, COALESCE(error, ''), COALESCE(error_class, ''), COALESCE(idempotency_key, ''), tries,
		input_tokens, output_tokens, cost_usd, COALESCE(delivery, ''), started_at, ended_at, duration_ms, last_seq,
		first_seq, waiting_at, substeps, cost_unknown, copied_from, cache_read_tokens, cache_write_tokens,
		reasoning_tokens, COALESCE(model, '')
		FROM steps WHERE run_id = $1 ORDER BY first_seq, step_id, attempt`, runID)
	if err != nil {
		return nil, fmt.Errorf("reading the steps of run %s: %w", runID, err)
	}
	defer rows.Close()
	var out []readmodel.StepRow
	for rows.Next() {
		var (
			s              readmodel.StepRow
			status         string
			input, output  []byte
			substeps       []byte
			attempt, tries int32
			started, ended pgtype.Timestamptz
			waiting        pgtype.Timestamptz
			last, first    int64
		)
		if err := rows.Scan(&s.RunID, &s.StepID, &attempt, &s.NodeID, &s.NodeType, &status, &input, &output,
			&s.Error, &s.ErrorClass, &s.IdempotencyKey, &tries, &s.InputTokens, &s.OutputTokens, &s.CostUSD,
			&s.Delivery, &started, &ended, &s.DurationMs, &last, &first, &waiting, &substeps, &s.CostUnknown, &s.CopiedFrom,
			&s.CacheReadTokens, &s.CacheWriteTokens, &s.ReasoningTokens, &s.Model); err != nil {
			return nil, fmt.Errorf("reading the steps of run %s: %w", runID, err)
		}
		s.Status, s.Input, s.Output, s.Substeps = engine.StepStatus(status), input, output, substeps
		s.Attempt, s.Tries, s.LastSeq, s.FirstSeq = int(attempt), int(tries), uint64(last), uint64(first)
		if waiting.Valid {
			s.WaitingAt = waiting.Time
		}
		if started.Valid {
			s.StartedAt = started.Time
		}
		if ended.Valid {
			s.EndedAt = ended.Time
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the steps of run %s: %w", runID, err)
	}
	return out, nil
}

// Orphans returns up to limit runs that are running or queued, the ones
// updated longest ago first. They are candidates for the recovery sweep,
// which checks each for a live lease and pending work before re-enqueuing
// it.
func (q *Reader) Orphans(ctx context.Context, limit int) ([]string, error) {
	if limit <= 0 {
		limit = 20
	}
	rows, err := q.pool.Query(ctx, `SELECT run_id FROM runs WHERE status IN ('running', 'queued')
		ORDER BY updated_at, run_id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("listing orphan candidates: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing orphan candidates: %w", err)
	}
	return ids, nil
}

// Checkpoint returns the stream sequence up to which projector name has
// written (DefaultName when empty); 0 before its first batch.
func (q *Reader) Checkpoint(ctx context.Context, name string) (uint64, error) {
	if name == "" {
		name = DefaultName
	}
	return readCheckpoint(ctx, q.pool, name)
}

// QueuedRuns counts the runs waiting for a worker (status queued) on each
// work queue: pal_runs_queued. Queues with none are absent.
func (q *Reader) QueuedRuns(ctx context.Context) (map[string]int64, error) {
	rows, err := q.pool.Query(ctx, "SELECT queue, count(*) FROM runs WHERE status = 'queued' GROUP BY queue")
	if err != nil {
		return nil, fmt.Errorf("counting queued runs: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return nil, fmt.Errorf("counting queued runs: %w", err)
		}
		out[name] = n
	}
	return out, rows.Err()
}
