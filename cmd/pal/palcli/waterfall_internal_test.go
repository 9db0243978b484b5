package palcli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/runs"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// TestWaterfallGolden draws a finished run with a retried step, an
// approval that waited 7 s, a failed step, and a run in flight whose
// approval still waits, at two widths, and compares with testdata.
func TestWaterfallGolden(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(ms int) string { return runs.FormatTime(t0.Add(time.Duration(ms) * time.Millisecond)) }
	finished := &runs.RunView{RunID: "run_golden", Status: engine.StatusFailed, CreatedAt: at(0), EndedAt: at(10000), Steps: []runs.StepView{
		{StepID: "start", NodeType: "trigger", Status: engine.StepCompleted, Attempts: 1, StartedAt: at(5), EndedAt: at(6), DurationMs: 1},
		{StepID: "draft", NodeType: "ai-step", Status: engine.StepCompleted, Attempts: 3, StartedAt: at(10), EndedAt: at(1500), DurationMs: 1490},
		{StepID: "review", NodeType: "approval", Status: engine.StepCompleted, Attempts: 1, StartedAt: at(1500), EndedAt: at(8600),
			DurationMs: 7100, WaitingSince: at(1550), WaitMs: 7000},
		{StepID: "publish", NodeType: "connector", Status: engine.StepFailed, Attempts: 2, StartedAt: at(8600), EndedAt: at(10000), DurationMs: 1400},
	}}
	inFlight := &runs.RunView{RunID: "run_live", Status: engine.StatusWaiting, CreatedAt: at(0), Steps: []runs.StepView{
		{StepID: "start", NodeType: "trigger", Status: engine.StepCompleted, Attempts: 1, StartedAt: at(0), EndedAt: at(1), DurationMs: 1},
		{StepID: "ok", NodeType: "approval", Status: engine.StepWaiting, Attempts: 1, StartedAt: at(2), WaitingSince: at(3),
			Input: []byte(`{"prompt":"Ship it?","approvers":["ann"]}`)},
	}}
	// Five branches at once, one failing the run, its siblings interrupted:
	// the lane view follows the steps.
	fanOut := &runs.RunView{RunID: "run_fan", Status: engine.StatusFailed, CreatedAt: at(0), EndedAt: at(4000), Steps: []runs.StepView{
		{StepID: "b0", NodeType: "ai-step", Status: engine.StepCompleted, Attempts: 1, StartedAt: at(100), EndedAt: at(1200), DurationMs: 1100},
		{StepID: "b1", NodeType: "ai-step", Status: engine.StepCompleted, Attempts: 1, StartedAt: at(100), EndedAt: at(900), DurationMs: 800},
		{StepID: "b2", NodeType: "ai-step", Status: engine.StepCompleted, Attempts: 1, StartedAt: at(100), EndedAt: at(2000), DurationMs: 1900},
		{StepID: "b3", NodeType: "ai-step", Status: engine.StepCompleted, Attempts: 1, StartedAt: at(1000), EndedAt: at(2500), DurationMs: 1500},
		{StepID: "b4", NodeType: "ai-step", Status: engine.StepFailed, Attempts: 1, StartedAt: at(1300), EndedAt: at(3900), DurationMs: 2600},
		{StepID: "b5", NodeType: "ai-step", Status: engine.StepFailed, Attempts: 1, StartedAt: at(2600), EndedAt: at(3950), DurationMs: 1350},
	}}
	for _, tc := range []struct {
		name  string
		v     *runs.RunView
		width int
		now   time.Time
	}{
		{"fan_out_80", fanOut, 80, t0.Add(time.Hour)},
		{"finished_80", finished, 80, t0.Add(time.Hour)},
		{"finished_120", finished, 120, t0.Add(time.Hour)},
		{"in_flight_60", inFlight, 60, t0.Add(900 * time.Millisecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, printWaterfall(&buf, tc.v, tc.width, tc.now))
			require.NoError(t, printWaiting(&buf, tc.v, tc.now))
			path := filepath.Join("testdata", "waterfall_"+tc.name+".golden")
			if *update {
				require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "run with -update to write it")
			require.Equal(t, string(want), buf.String())
		})
	}
}

// TestAgesUnderASecond: sub-second durations and ages print as such.
func TestAgesUnderASecond(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	require.Equal(t, "420µs", fmtDuration(420*time.Microsecond))
	require.Equal(t, "0ms", fmtDuration(0))
	require.Equal(t, "850ms", fmtDuration(850*time.Millisecond))
	require.Contains(t, fmtTime(now.Add(-340*time.Millisecond), now), "(340ms ago)")
	require.Contains(t, fmtTime(now.Add(-12*time.Second), now), "(12s ago)")
	require.Contains(t, fmtTime(now.Add(3*time.Second), now), "(just now)")
	require.Contains(t, fmtTime(now.Add(-3*time.Minute), now), "(3m00s ago)")
}
