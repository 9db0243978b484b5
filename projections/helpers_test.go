package projections_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/readmodel"
	"github.com/palrun/pal/workers"
)

// bundle is one test's PAL (see paltest.Stack) with its own database.
type bundle struct {
	*paltest.Stack
	pg   *testenv.PG
	pool *pgxpool.Pool
}

type bundleCfg struct {
	stack  []paltest.Option
	pgOpts []testenv.PGOption
}

type bundleOpt func(*bundleCfg)

// strictMode makes the bundle's workers pack events (PAL_DURABILITY=strict).
func strictMode() bundleOpt {
	return func(c *bundleCfg) { c.stack = append(c.stack, paltest.Strict()) }
}

// noJournalCheck skips the journal check at cleanup, for a test that
// writes what is not a PAL event on purpose.
func noJournalCheck() bundleOpt {
	return func(c *bundleCfg) { c.stack = append(c.stack, paltest.NoJournalCheck()) }
}

// ownPostgres gives the bundle a PostgreSQL server of its own, to stop.
func ownPostgres() bundleOpt {
	return func(c *bundleCfg) { c.pgOpts = append(c.pgOpts, testenv.OwnServer()) }
}

func setup(t *testing.T, opts ...bundleOpt) *bundle {
	t.Helper()
	var cfg bundleCfg
	for _, o := range opts {
		o(&cfg)
	}
	b := &bundle{Stack: paltest.New(t, cfg.stack...)}
	b.pg = testenv.Postgres(t, cfg.pgOpts...)
	b.pool = b.pg.Pool(t)
	_, err := projections.Migrate(context.Background(), b.pool)
	require.NoError(t, err)
	return b
}

// projector starts an in-process projector; it stops when the test ends.
func (b *bundle) projector(t *testing.T, cfg projections.Config) *projections.Projector {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = paltest.Logger(t)
	}
	p := projections.New(b.pool, b.Store, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, p.Stop(ctx))
	})
	return p
}

// stopProjector stops p at once.
func stopProjector(t *testing.T, p *projections.Projector) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Stop(ctx))
}

// caughtUp waits until p has projected everything in the stream.
func caughtUp(t *testing.T, p *projections.Projector) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, p.WaitCaughtUp(ctx))
}

// worker starts an in-process worker that drives 16 runs at once; it
// stops when the test ends.
func (b *bundle) worker(t *testing.T, id string) *workers.Worker {
	t.Helper()
	return b.Worker(t, id, paltest.Concurrency(16))
}

func ev(k event.Kind, step string, attempt int, payload any) event.Event {
	return event.MustNew(k, step, attempt, payload)
}

// seqWorkflow is a chain of n ai-steps s1..sn.
func seqWorkflow(n int, prov string) string {
	return paltest.Chain(fmt.Sprintf("seq-%d", n), n, func(i int, prev string) (string, string) {
		id := fmt.Sprintf("s%d", i)
		prompt := fmt.Sprintf("step %d of {{input.topic}}", i)
		if i > 1 {
			prompt = fmt.Sprintf("step %d after: {{steps.%s.output.text}}", i, prev)
		}
		return id, fmt.Sprintf(`{"id":%q,"type":"ai-step","data":{"provider":%q,"model":"m","prompt":%q}}`, id, prov, prompt)
	})
}

// echoChain is a chain of n built-in echo tool steps.
func echoChain(n int) string {
	return paltest.Chain(fmt.Sprintf("echo-%d", n), n, func(i int, _ string) (string, string) {
		id := fmt.Sprintf("t%d", i)
		return id, fmt.Sprintf(`{"id":%q,"type":"tool","data":{"tool":"echo","input":{"i":%d,"v":"{{input.v}}"}}}`, id, i)
	})
}

// webhookWorkflow delivers one webhook (retried on 5xx) and then echoes.
func webhookWorkflow(url string) string {
	return fmt.Sprintf(`{"name":"notify","nodes":[{"id":"start","type":"trigger"},
		{"id":"notify","type":"connector","data":{"kind":"webhook","url":%q,"body":{"n":"{{input.n}}"},
		 "retry":{"maxAttempts":3,"backoffMs":10,"retryableClasses":["connector"]}}},
		{"id":"after","type":"tool","data":{"tool":"echo","input":{"ok":true}}}],
		"edges":[{"from":"start","to":"notify"},{"from":"notify","to":"after"}]}`, url)
}

// streamMsg is one message of PAL_EVENTS.
type streamMsg struct {
	seq uint64
	evs []event.Event
}

// readStream reads every message of PAL_EVENTS with its stream sequence.
func readStream(t *testing.T, js jetstream.JetStream) []streamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	last := s.CachedInfo().State.LastSeq
	if last == 0 {
		return nil
	}
	cons, err := js.OrderedConsumer(ctx, eventstore.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{eventstore.EventsPrefix + "*"}, InactiveThreshold: 5 * time.Second})
	require.NoError(t, err)
	it, err := cons.Messages()
	require.NoError(t, err)
	defer it.Stop()
	var out []streamMsg
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		require.NoError(t, err)
		md, err := m.Metadata()
		require.NoError(t, err)
		evs, err := event.Decode(m.Data())
		require.NoError(t, err)
		out = append(out, streamMsg{seq: md.Sequence.Stream, evs: evs})
		if md.Sequence.Stream >= last {
			return out
		}
	}
}

type journalRowT struct {
	runID     string
	seq       int64
	kind      string
	stepID    pgtype.Text
	attempt   pgtype.Int4
	workerID  string
	data      []byte
	streamSeq int64
	ts        time.Time
}

// requireProjectionMatchesStream asserts that journal_events holds each
// (run_id, seq) of PAL_EVENTS exactly once, with the same kind, data (as
// JSON values), step, attempt, worker, timestamp and stream sequence, and
// nothing else. It also checks the journal's own invariants, and returns
// the journal.
func requireProjectionMatchesStream(t *testing.T, pool *pgxpool.Pool, nc *nats.Conn) testenv.Journal {
	t.Helper()
	journal := testenv.ReadJournal(t, nc)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	msgs := readStream(t, js)

	rows, err := pool.Query(context.Background(), `SELECT run_id, seq, kind, step_id, attempt, worker_id, data, stream_seq, ts
		FROM journal_events`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (journalRowT, error) {
		var row journalRowT
		err := r.Scan(&row.runID, &row.seq, &row.kind, &row.stepID, &row.attempt, &row.workerID, &row.data, &row.streamSeq, &row.ts)
		return row, err
	})
	require.NoError(t, err)
	type key struct {
		run string
		seq uint64
	}
	byKey := make(map[key]journalRowT, len(got))
	for _, r := range got {
		k := key{r.runID, uint64(r.seq)}
		_, dup := byKey[k]
		require.False(t, dup, "journal_events holds run %s seq %d twice", r.runID, r.seq)
		byKey[k] = r
	}
	n := 0
	for _, m := range msgs {
		for _, e := range m.evs {
			n++
			r, ok := byKey[key{e.RunID, e.Seq}]
			require.True(t, ok, "journal_events lacks run %s seq %d (%s, stream seq %d)", e.RunID, e.Seq, e.Kind, m.seq)
			require.Equal(t, string(e.Kind), r.kind, "run %s seq %d", e.RunID, e.Seq)
			require.Equal(t, int64(m.seq), r.streamSeq, "run %s seq %d", e.RunID, e.Seq)
			require.Equal(t, e.StepID, r.stepID.String, "run %s seq %d", e.RunID, e.Seq)
			require.Equal(t, e.Attempt, int(r.attempt.Int32), "run %s seq %d", e.RunID, e.Seq)
			require.Equal(t, e.WorkerID, r.workerID, "run %s seq %d", e.RunID, e.Seq)
			require.True(t, e.TS.Truncate(time.Microsecond).Equal(r.ts), "run %s seq %d: ts %v, row %v", e.RunID, e.Seq, e.TS, r.ts)
			require.JSONEq(t, storedJSON(e.Data), string(r.data), "run %s seq %d", e.RunID, e.Seq)
		}
	}
	require.Equal(t, n, len(got), "journal_events holds rows the stream does not")
	return journal
}

// storedJSON is raw as the projection stores it: Postgres refuses NUL
// characters, which become U+FFFD.
func storedJSON(raw []byte) string {
	return strings.ReplaceAll(string(raw), `\u0000`, `\ufffd`)
}

// requireRowsMatchFold asserts that runs, steps and side_effect_receipts
// hold exactly what engine.Fold makes of each run's journal (j, from
// requireProjectionMatchesStream).
func requireRowsMatchFold(t *testing.T, pool *pgxpool.Pool, j testenv.Journal) {
	t.Helper()
	var nSteps, nReceipts int
	for runID, evs := range j {
		s, r := requireRunMatchesFold(t, pool, runID, evs)
		nSteps += s
		nReceipts += r
	}
	var runs, steps, receipts int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM steps),
		(SELECT count(*) FROM side_effect_receipts)`).Scan(&runs, &steps, &receipts))
	require.Equal(t, len(j), runs, "runs rows")
	require.Equal(t, nSteps, steps, "steps rows")
	require.Equal(t, nReceipts, receipts, "side_effect_receipts rows")
}

// requireRunMatchesFold asserts that a run's rows are what engine.Fold
// makes of evs, and returns how many steps and receipt rows it has.
func requireRunMatchesFold(t *testing.T, pool *pgxpool.Pool, runID string, evs []event.Event) (steps, receipts int) {
	t.Helper()
	st, err := engine.Fold(evs)
	require.NoError(t, err, "run %s", runID)
	d, err := projections.NewReader(pool).GetRun(context.Background(), runID)
	require.NoError(t, err, "run %s", runID)
	r := d.Run
	require.Equal(t, st.Status, r.Status, "run %s", runID)
	require.Equal(t, st.LastSeq, r.LastSeq, "run %s", runID)
	require.Equal(t, st.Created.WorkflowName, r.WorkflowName, "run %s", runID)
	require.Equal(t, st.Created.WorkflowHash, r.WorkflowHash, "run %s", runID)
	requireJSON(t, st.Created.Workflow, r.Workflow, "run %s workflow", runID)
	requireJSON(t, st.Created.Input, r.Input, "run %s input", runID)
	requireJSON(t, st.Output, r.Output, "run %s output", runID)
	require.Equal(t, st.Created.ParentRunID, r.ParentRunID, "run %s", runID)
	require.Equal(t, st.Created.ParentStepID, r.ParentStepID, "run %s", runID)
	require.Equal(t, st.Created.Depth, r.Depth, "run %s", runID)
	if len(st.Created.Labels) > 0 || len(r.Labels) > 0 { // none reads back as {}
		require.Equal(t, st.Created.Labels, r.Labels, "run %s labels", runID)
	}
	require.Equal(t, st.Usage.InputTokens, r.InputTokens, "run %s", runID)
	require.Equal(t, st.Usage.OutputTokens, r.OutputTokens, "run %s", runID)
	require.Equal(t, st.Usage.TotalTokens, r.TotalTokens, "run %s", runID)
	require.InDelta(t, st.Usage.CostUSD, r.CostUSD, 1e-9, "run %s", runID)
	require.Equal(t, st.Error, r.Error, "run %s", runID)
	require.Equal(t, st.ErrorCode, r.ErrorCode, "run %s", runID)
	require.Equal(t, st.FailedStep, r.FailedStep, "run %s", runID)
	require.Equal(t, st.Resumes, r.Resumes, "run %s", runID)
	require.Equal(t, st.LastWorker, r.LastWorker, "run %s", runID)
	requireTime(t, st.CreatedAt, r.CreatedAt, "run %s created_at", runID)
	requireTime(t, st.UpdatedAt, r.UpdatedAt, "run %s updated_at", runID)
	requireTime(t, st.EndedAt, r.EndedAt, "run %s ended_at", runID)

	type sk struct {
		step    string
		attempt int
	}
	rows := map[sk]readmodel.StepRow{}
	for _, s := range d.Steps {
		rows[sk{s.StepID, s.Attempt}] = s
	}
	for _, id := range st.Order {
		s := st.Steps[id]
		for _, a := range s.Attempts {
			steps++
			row, ok := rows[sk{id, a.Attempt}]
			require.True(t, ok, "run %s: no steps row for %s attempt %d", runID, id, a.Attempt)
			where := fmt.Sprintf("run %s step %s attempt %d", runID, id, a.Attempt)
			require.Equal(t, a.Status, row.Status, where)
			require.Equal(t, s.NodeID, row.NodeID, where)
			require.Equal(t, s.NodeType, row.NodeType, where)
			require.Equal(t, a.Key, row.IdempotencyKey, where)
			require.Equal(t, a.Tries, row.Tries, where)
			require.Equal(t, a.Error, row.Error, where)
			require.Equal(t, a.Class, row.ErrorClass, where)
			require.Equal(t, a.Delivery, row.Delivery, where)
			require.Equal(t, a.DurationMs, row.DurationMs, where)
			require.Equal(t, a.LastSeq, row.LastSeq, where)
			requireJSON(t, a.Input, row.Input, where+" input")
			requireJSON(t, a.Output, row.Output, where+" output")
			requireTime(t, a.StartedAt, row.StartedAt, where+" started_at")
			requireTime(t, a.EndedAt, row.EndedAt, where+" ended_at")
			if a.Usage != nil {
				require.Equal(t, a.Usage.InputTokens, row.InputTokens, where)
				require.Equal(t, a.Usage.OutputTokens, row.OutputTokens, where)
				require.InDelta(t, a.Usage.CostUSD, row.CostUSD, 1e-9, where)
			}
			if a.Claimed {
				receipts++
				requireReceipt(t, pool, runID, id, a)
			}
		}
	}
	require.Equal(t, steps, len(d.Steps), "run %s: steps rows", runID)
	return steps, receipts
}

func requireReceipt(t *testing.T, pool *pgxpool.Pool, runID, stepID string, a *engine.Attempt) {
	t.Helper()
	var (
		key, conn, target, status pgtype.Text
		code                      pgtype.Int4
		claimed, delivered        pgtype.Timestamptz
		last                      int64
	)
	err := pool.QueryRow(context.Background(), `SELECT idempotency_key, connector, target, status, http_status,
		claimed_at, delivered_at, last_seq FROM side_effect_receipts WHERE run_id = $1 AND step_id = $2 AND attempt = $3`,
		runID, stepID, a.Attempt).Scan(&key, &conn, &target, &status, &code, &claimed, &delivered, &last)
	where := fmt.Sprintf("receipt of run %s step %s attempt %d", runID, stepID, a.Attempt)
	require.NoError(t, err, where)
	wantStatus := "claimed"
	switch {
	case a.Delivered:
		wantStatus = "delivered"
	case a.Failed:
		wantStatus = "failed"
	case a.Status == engine.StepCompleted || a.Status == engine.StepFailed || a.Status == engine.StepRetried:
		wantStatus = "unconfirmed"
	}
	require.Equal(t, wantStatus, status.String, where)
	require.Equal(t, a.Key, key.String, where)
	require.Equal(t, a.Connector, conn.String, where)
	require.Equal(t, a.Target, target.String, where)
	require.Equal(t, a.DeliveryStatus, int(code.Int32), where)
	require.Equal(t, a.LastSeq, uint64(last), where)
	requireTime(t, a.ClaimedAt, claimed.Time, where+" claimed_at")
	requireTime(t, a.DeliveredAt, delivered.Time, where+" delivered_at")
}

func requireJSON(t *testing.T, want, got []byte, msgAndArgs ...any) {
	t.Helper()
	if len(want) == 0 {
		require.Empty(t, got, msgAndArgs...)
		return
	}
	require.JSONEq(t, storedJSON(want), string(got), msgAndArgs...)
}

// requireTime compares an event timestamp with a stored one (Postgres keeps
// microseconds; zero means NULL).
func requireTime(t *testing.T, want, got time.Time, msgAndArgs ...any) {
	t.Helper()
	if want.IsZero() {
		require.True(t, got.IsZero(), msgAndArgs...)
		return
	}
	require.True(t, want.Truncate(time.Microsecond).Equal(got), append([]any{"want %v, got %v: "}, msgAndArgs...)...)
}

// snapshot is every row of the five tables, as JSON, in key order
// (projection_checkpoints without updated_at); with xmin, each row's
// inserting transaction too, which shows whether a row was rewritten.
type snapshot map[string][]string

func takeSnapshot(t *testing.T, pool *pgxpool.Pool, withXmin bool) snapshot {
	t.Helper()
	s := snapshot{}
	tables := map[string]string{
		"journal_events":         "run_id, seq",
		"runs":                   "run_id",
		"steps":                  "run_id, step_id, attempt",
		"side_effect_receipts":   "run_id, step_id, attempt",
		"projection_checkpoints": "projector",
	}
	for table, order := range tables {
		expr := "to_jsonb(x)"
		if table == "projection_checkpoints" {
			expr = "to_jsonb(x) - 'updated_at'"
		}
		if withXmin {
			expr = fmt.Sprintf("(%s || jsonb_build_object('xmin', x.xmin::text))", expr)
		}
		rows, err := pool.Query(context.Background(), fmt.Sprintf("SELECT %s::text FROM %s x ORDER BY %s", expr, table, order))
		require.NoError(t, err)
		vals, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		s[table] = vals
	}
	return s
}

func requireSnapshotsEqual(t *testing.T, want, got snapshot) {
	t.Helper()
	tables := make([]string, 0, len(want))
	for k := range want {
		tables = append(tables, k)
	}
	sort.Strings(tables)
	for _, table := range tables {
		require.Equal(t, len(want[table]), len(got[table]), "%s: row count", table)
		for i := range want[table] {
			require.Equal(t, want[table][i], got[table][i], "%s row %d", table, i)
		}
	}
}
