package projections_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/readmodel"
)

func TestReaderQueries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.projector(t, projections.Config{})
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(d time.Duration, e event.Event) event.Event { e.TS = base.Add(d); return e }
	created := func(i int) event.Event {
		return at(time.Duration(i)*time.Second, ev(event.RunCreated, "", 0, event.RunCreatedData{WorkflowName: "q", Input: json.RawMessage(`{}`)}))
	}
	resumed := func(i int) event.Event {
		return at(time.Duration(i)*time.Second+100*time.Millisecond, ev(event.RunResumed, "", 0, event.RunResumedData{Worker: "w", ResumeCount: 1}))
	}
	ids := make([]string, 5)
	for i := range ids {
		ids[i] = event.NewRunID()
	}
	b.AppendRaw(t, ids[0], created(0)) // queued
	b.AppendRaw(t, ids[1], created(1), resumed(1))
	b.AppendRaw(t, ids[2], created(2), resumed(2),
		at(2*time.Second+200*time.Millisecond, ev(event.StepStarted, "s1", 1, event.StepStartedData{NodeID: "s1", NodeType: "tool", IdempotencyKey: event.IdempotencyKey(ids[2], "s1", 1)})),
		at(2*time.Second+300*time.Millisecond, ev(event.StepCompleted, "s1", 1, event.StepCompletedData{Output: json.RawMessage(`{"ok":true}`), DurationMs: 100})),
		at(2*time.Second+400*time.Millisecond, ev(event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{"ok":true}`)})))
	b.AppendRaw(t, ids[3], created(3), resumed(3),
		at(3*time.Second+200*time.Millisecond, ev(event.RunFailed, "", 0, event.RunFailedData{Error: "boom", Code: event.CodeInternal})))
	b.AppendRaw(t, ids[4], created(4), resumed(4))
	caughtUp(t, p)

	q := projections.NewReader(b.pool)
	ctx := context.Background()
	idsOf := func(rs []readmodel.RunRow) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.RunID)
		}
		return out
	}
	all, err := q.ListRuns(ctx, projections.RunFilter{})
	require.NoError(t, err)
	require.Equal(t, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}, idsOf(all), "newest first")
	require.Nil(t, all[2].Workflow, "listings leave the snapshot out")

	// Pages of two.
	var paged []string
	cursor := ""
	for {
		page, err := q.ListRuns(ctx, projections.RunFilter{Limit: 2, Before: cursor})
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		require.LessOrEqual(t, len(page), 2)
		paged = append(paged, idsOf(page)...)
		cursor = page[len(page)-1].Cursor()
	}
	require.Equal(t, idsOf(all), paged)

	running, err := q.ListRuns(ctx, projections.RunFilter{Status: engine.StatusRunning})
	require.NoError(t, err)
	require.Equal(t, []string{ids[4], ids[1]}, idsOf(running))
	_, err = q.ListRuns(ctx, projections.RunFilter{Before: "not a cursor"})
	require.ErrorIs(t, err, projections.ErrBadCursor)

	d, err := q.GetRun(ctx, ids[2])
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, d.Run.Status)
	require.Equal(t, base.Add(2*time.Second+400*time.Millisecond), d.Run.EndedAt.UTC())
	require.JSONEq(t, `{"ok":true}`, string(d.Run.Output))
	require.Len(t, d.Steps, 1)
	require.Equal(t, event.IdempotencyKey(ids[2], "s1", 1), d.Steps[0].IdempotencyKey)
	require.Equal(t, int64(100), d.Steps[0].DurationMs)
	d, err = q.GetRun(ctx, ids[3])
	require.NoError(t, err)
	require.Equal(t, "boom", d.Run.Error)
	require.Equal(t, event.CodeInternal, d.Run.ErrorCode)

	_, err = q.GetRun(ctx, "run_missing")
	require.ErrorIs(t, err, projections.ErrRunNotFound)
	require.ErrorIs(t, err, eventstore.ErrRunNotFound)

	orphans, err := q.Orphans(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, []string{ids[0], ids[1], ids[4]}, orphans, "running or queued, least recently updated first")
	orphans, err = q.Orphans(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, []string{ids[0], ids[1]}, orphans)
	j := requireProjectionMatchesStream(t, b.pool, b.NC)
	requireRowsMatchFold(t, b.pool, j)
}
