package projections_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/readmodel"
)

// Every filter of a listing, alone and together, over runs projected from
// their journals: labels, status, workflow, the creation time range, the
// error code and the error's text (matched as text: '%' and '_' are not
// wildcards), with the cursor over a filtered listing.
func TestListRunsFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.projector(t, projections.Config{})
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	at := func(i int, e event.Event) event.Event { e.TS = base.Add(time.Duration(i) * time.Hour); return e }
	type run struct {
		wf      string
		labels  map[string]string
		failed  *event.RunFailedData
		succeed bool
		sched   string
	}
	specs := []run{
		{wf: "a", labels: map[string]string{"customer": "acme", "env": "prod"}},
		{wf: "b", labels: map[string]string{"customer": "acme", "env": "dev"},
			failed: &event.RunFailedData{Error: "Timeout calling the 100%_ready API", Code: event.CodeStepFailed}},
		{wf: "a", labels: map[string]string{"customer": "globex"},
			failed: &event.RunFailedData{Error: "budget max_cost_usd exceeded", Code: event.CodeBudgetExceeded}},
		{wf: "a", succeed: true, sched: "nightly"},
		{wf: "a", labels: map[string]string{"customer": "acme"}, sched: "nightly"},
	}
	ids := make([]string, len(specs))
	for i, s := range specs {
		ids[i] = fmt.Sprintf("run_f%d", i)
		evs := []event.Event{at(i, ev(event.RunCreated, "", 0, event.RunCreatedData{WorkflowName: s.wf, Input: json.RawMessage(`{}`), Labels: s.labels,
			Schedule: s.sched, Tick: tickIf(s.sched, base.Add(time.Duration(i)*time.Hour))}))}
		if i > 0 { // run 0 stays queued
			evs = append(evs, at(i, ev(event.RunResumed, "", 0, event.RunResumedData{Worker: "w", ResumeCount: 1})))
		}
		switch {
		case s.failed != nil:
			evs = append(evs, at(i, ev(event.RunFailed, "", 0, *s.failed)))
		case s.succeed:
			evs = append(evs, at(i, ev(event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{}`)})))
		}
		b.AppendRaw(t, ids[i], evs...)
	}
	caughtUp(t, p)

	q := projections.NewReader(b.pool)
	ctx := context.Background()
	list := func(f projections.RunFilter) []string {
		t.Helper()
		rows, err := q.ListRuns(ctx, f)
		require.NoError(t, err)
		out := []string{}
		for _, r := range rows {
			out = append(out, r.RunID)
		}
		return out
	}
	acme := map[string]string{"customer": "acme"}
	tests := []struct {
		name string
		f    projections.RunFilter
		want []int
	}{
		{"no filter", projections.RunFilter{}, []int{4, 3, 2, 1, 0}},
		{"one label", projections.RunFilter{Labels: acme}, []int{4, 1, 0}},
		{"two labels", projections.RunFilter{Labels: map[string]string{"customer": "acme", "env": "prod"}}, []int{0}},
		{"a label no run has", projections.RunFilter{Labels: map[string]string{"customer": "initech"}}, []int{}},
		{"status", projections.RunFilter{Status: engine.StatusFailed}, []int{2, 1}},
		{"workflow", projections.RunFilter{Workflow: "b"}, []int{1}},
		{"schedule", projections.RunFilter{Schedule: "nightly"}, []int{4, 3}},
		{"schedule and label", projections.RunFilter{Schedule: "nightly", Labels: acme}, []int{4}},
		{"a schedule no run has", projections.RunFilter{Schedule: "weekly"}, []int{}},
		{"since", projections.RunFilter{Since: base.Add(3 * time.Hour)}, []int{4, 3}},
		{"until, exclusive", projections.RunFilter{Until: base.Add(2 * time.Hour)}, []int{1, 0}},
		{"since and until", projections.RunFilter{Since: base.Add(time.Hour), Until: base.Add(4 * time.Hour)}, []int{3, 2, 1}},
		{"error code", projections.RunFilter{ErrorCode: event.CodeStepFailed}, []int{1}},
		{"text, any case", projections.RunFilter{Text: "TIMEOUT"}, []int{1}},
		{"text with %", projections.RunFilter{Text: "100%_r"}, []int{1}},
		{"% is no wildcard", projections.RunFilter{Text: "ax%co"}, []int{}},
		{"_ is no wildcard", projections.RunFilter{Text: "max_cost"}, []int{2}},
		{"_ matches only itself", projections.RunFilter{Text: "budget_max"}, []int{}},
		{"backslash", projections.RunFilter{Text: `\`}, []int{}},
		{"label and status", projections.RunFilter{Labels: acme, Status: engine.StatusFailed}, []int{1}},
		{"label and time", projections.RunFilter{Labels: acme, Since: base.Add(time.Hour)}, []int{4, 1}},
	}
	for _, tt := range tests {
		want := []string{}
		for _, i := range tt.want {
			want = append(want, ids[i])
		}
		require.Equal(t, want, list(tt.f), tt.name)
	}

	// The cursor pages through a filtered listing.
	page := list(projections.RunFilter{Labels: acme, Limit: 2})
	require.Equal(t, []string{ids[4], ids[1]}, page)
	rows, err := q.ListRuns(ctx, projections.RunFilter{Labels: acme, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []string{ids[0]}, list(projections.RunFilter{Labels: acme, Limit: 2, Before: rows[1].Cursor()}))

	// The read model carries the labels.
	require.Equal(t, acme, rows[0].Labels)
	d, err := q.GetRun(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, map[string]string{"customer": "acme", "env": "prod"}, d.Run.Labels)
	d, err = q.GetRun(ctx, ids[3])
	require.NoError(t, err)
	require.Empty(t, d.Run.Labels)
	d, err = q.GetRun(ctx, ids[0])
	require.NoError(t, err)
	require.Empty(t, d.Run.Schedule, "a run no schedule started")
	require.True(t, d.Run.Tick.IsZero())

	// And the schedule and tick.
	d, err = q.GetRun(ctx, ids[4])
	require.NoError(t, err)
	require.Equal(t, "nightly", d.Run.Schedule)
	require.Equal(t, base.Add(4*time.Hour), d.Run.Tick)
}

// tickIf is run_created's tick of a run schedule sched started, "" for
// none.
func tickIf(sched string, t time.Time) string {
	if sched == "" {
		return ""
	}
	return event.FormatTick(t)
}

// fillRuns writes n runs straight into the runs table (the projector's
// way in is measured by BenchmarkProjectorThroughput) and analyzes it:
// every tenth failed (half step_failed, half budget_exceeded, with a
// distinct message), one in ten running, the rest succeeded; 20
// workflows; label customer one of 100 and env prod or dev; one in 50
// started by one of 5 schedules (s0…s4), at its tick; one run a minute
// from base.
func fillRuns(tb testing.TB, pool *pgxpool.Pool, n int, base time.Time) {
	tb.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO runs (run_id, status, workflow_name, input, error, error_code,
		created_at, updated_at, last_seq, labels, schedule, tick)
	SELECT format('run_%s', lpad(i::text, 7, '0')),
		CASE i % 10 WHEN 0 THEN 'failed' WHEN 1 THEN 'running' ELSE 'succeeded' END,
		'wf' || (i % 20), '{}'::jsonb,
		CASE WHEN i % 10 = 0 THEN format('step s%s failed: %s', i % 7, md5(i::text)) END,
		CASE WHEN i % 20 = 0 THEN 'budget_exceeded' WHEN i % 10 = 0 THEN 'step_failed' END,
		$1::timestamptz + i * interval '1 minute', $1::timestamptz + i * interval '1 minute', 1,
		jsonb_build_object('customer', 'c' || (i % 100), 'env', CASE WHEN i % 2 = 0 THEN 'prod' ELSE 'dev' END),
		CASE WHEN i % 50 = 3 THEN 's' || (i % 5) END,
		CASE WHEN i % 50 = 3 THEN $1::timestamptz + i * interval '1 minute' END
	FROM generate_series(1, $2::int) AS i`, base, n)
	require.NoError(tb, err)
	_, err = pool.Exec(ctx, "ANALYZE runs")
	require.NoError(tb, err)
}

// listFilters are the filters the plans and the benchmark cover, over
// what fillRuns wrote from base: each alone, and a label with a time
// range.
func listFilters(base time.Time) []struct {
	name string
	f    projections.RunFilter
} {
	return []struct {
		name string
		f    projections.RunFilter
	}{
		{"label", projections.RunFilter{Labels: map[string]string{"customer": "c42"}}},
		{"status", projections.RunFilter{Status: engine.StatusFailed}},
		{"workflow", projections.RunFilter{Workflow: "wf7"}},
		{"schedule", projections.RunFilter{Schedule: "s3"}},
		{"since_until", projections.RunFilter{Since: base.Add(2000 * time.Minute), Until: base.Add(2500 * time.Minute)}},
		{"error_code", projections.RunFilter{ErrorCode: event.CodeBudgetExceeded}},
		{"q", projections.RunFilter{Text: "D3D9446802A4"}}, // md5('10'): run 10's message
		{"label_since_until", projections.RunFilter{Labels: map[string]string{"customer": "c42"},
			Since: base.Add(2000 * time.Minute), Until: base.Add(6000 * time.Minute)}},
	}
}

// Each filter's query over 10,000 runs has an index that serves it: with
// sequential scans priced out of reach, its plan reads an index, never the
// whole table. Both plans are logged, the planner's own choice first (at
// 10,000 small rows it may well prefer to read the table):
// go test -v -run TestListRunsPlans ./projections/
func TestListRunsPlans(t *testing.T) {
	t.Parallel()
	pool := setup(t).pool
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fillRuns(t, pool, 10_000, base)
	for _, c := range listFilters(base) {
		chosen := explain(t, pool, c.f, false)
		forced := explain(t, pool, c.f, true)
		t.Logf("%s, the planner's choice:\n%s\n%s, without sequential scans:\n%s", c.name, chosen, c.name, forced)
		require.NotContains(t, forced, "Seq Scan", c.name)
		require.Contains(t, forced, "Index", c.name)
		rows, err := projections.NewReader(pool).ListRuns(context.Background(), c.f)
		require.NoError(t, err)
		require.NotEmpty(t, rows, "%s finds runs", c.name)
	}
}

// explain is the plan of ListRuns(f); noSeq prices sequential scans out
// (enable_seqscan off, in a transaction of its own).
func explain(t *testing.T, pool *pgxpool.Pool, f projections.RunFilter, noSeq bool) string {
	t.Helper()
	ctx := context.Background()
	sql, args, err := projections.ListQuery(f)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	if noSeq {
		_, err = tx.Exec(ctx, "SET LOCAL enable_seqscan = off")
		require.NoError(t, err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
	require.NoError(t, err)
	var plan []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan = append(plan, line)
	}
	require.NoError(t, rows.Err())
	return strings.Join(plan, "\n")
}

// BenchmarkListRuns times each filter's page (the default 50 runs) over
// 10,000 runs: go test -run '^$' -bench BenchmarkListRuns ./projections/
func BenchmarkListRuns(b *testing.B) {
	pg := freshDB(b)
	pool := pg.Pool(b)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fillRuns(b, pool, 10_000, base)
	q := projections.NewReader(pool)
	ctx := context.Background()
	for _, c := range listFilters(base) {
		b.Run(c.name, func(b *testing.B) {
			var rows []readmodel.RunRow
			for b.Loop() {
				var err error
				if rows, err = q.ListRuns(ctx, c.f); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(rows)), "runs/op")
		})
	}
}
