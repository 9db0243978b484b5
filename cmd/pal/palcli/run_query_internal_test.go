package palcli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

// TestPrintRunShowsSubsteps: pal run get lists a process step's sub-steps
// under it.
func TestPrintRunShowsSubsteps(t *testing.T) {
	t.Parallel()
	v := &runs.RunView{RunID: "run_x", Status: engine.StatusRunning, CreatedAt: "2026-01-01T00:00:00.000000Z",
		Steps: []runs.StepView{{StepID: "work", NodeType: "process", Status: engine.StepRunning, Attempt: 1,
			StartedAt: "2026-01-01T00:00:01.000000Z", Substeps: []runs.SubstepView{
				{Name: "fetch", Status: engine.StepCompleted, Output: json.RawMessage(`{"pages":3}`)},
				{Name: "summarise", Status: engine.StepRunning}}}}}
	var b strings.Builder
	require.NoError(t, printRun(&b, v, "journal", time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC)))
	out := b.String()
	work := strings.Index(out, "\nwork ")
	fetch := strings.Index(out, "└ fetch")
	sum := strings.Index(out, "└ summarise")
	require.True(t, work >= 0 && fetch > work && sum > fetch, "sub-steps under their step:\n%s", out)
	require.Regexp(t, `└ fetch\s+substep\s+completed\s.*pages`, out)
	require.Regexp(t, `└ summarise\s+substep\s+running`, out)
}

// TestPrintRunSaysTheJournalWasRemoved: pal run get of a run read from
// Postgres after retention removed its journal says so.
func TestPrintRunSaysTheJournalWasRemoved(t *testing.T) {
	t.Parallel()
	v := &runs.RunView{RunID: "run_x", Status: engine.StatusSucceeded, CreatedAt: "2026-01-01T00:00:00.000000Z",
		EndedAt: "2026-01-01T00:00:02.000000Z", JournalRemovedAt: "2026-02-01T00:00:00.000000Z", Steps: []runs.StepView{}}
	var b strings.Builder
	require.NoError(t, printRun(&b, v, "postgres", time.Date(2026, 2, 1, 0, 1, 0, 0, time.UTC)))
	require.Regexp(t, `Journal\s+removed by retention \(PAL_RETENTION\)`, b.String())
	b.Reset()
	v.JournalRemovedAt = ""
	require.NoError(t, printRun(&b, v, "postgres", time.Date(2026, 2, 1, 0, 1, 0, 0, time.UTC)))
	require.NotContains(t, b.String(), "retention")
}

// TestFmtUSD: amounts render with their fixed decimals, and one too small
// for them with two significant digits, never as zero.
func TestFmtUSD(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v        float64
		decimals int
		want     string
	}{
		{0, 4, "$0.0000"},
		{1, 4, "$1.0000"},
		{0.0021, 4, "$0.0021"},
		{0.0001, 4, "$0.0001"},
		{0.00015, 4, "$0.0001"}, // 4 decimals at and above $0.0001, as before
		{1e-05, 4, "$0.00001"},
		{1.5e-05, 4, "$0.000015"},
		{1.234e-06, 4, "$0.0000012"},
		{9.99e-05, 4, "$0.0001"},
		{3e-09, 4, "$0.000000003"},
		{0.000123, 6, "$0.000123"},
		{1e-07, 6, "$0.0000001"},
	} {
		require.Equal(t, tc.want, fmtUSD(tc.v, tc.decimals), "%g with %d decimals", tc.v, tc.decimals)
	}
}

// TestBudgetLineSmallLimit: a maxCostUsd of 1e-05 reads $0.00001, not
// $0.0000.
func TestBudgetLineSmallLimit(t *testing.T) {
	t.Parallel()
	got := budgetLine(&event.Budget{MaxCostUSD: 1e-05}, engine.Spend{CostUSD: 3e-06}, "")
	require.Equal(t, "$0.000003 of $0.00001 (on exceed: fail)", got)
}
