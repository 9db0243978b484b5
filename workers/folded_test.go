package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// waitLoopWorkflow parks in each of its 6 iterations on signal "tick" and
// echoes what the signal carried.
const waitLoopWorkflow = `{"name":"ticks","nodes":[{"id":"start","type":"trigger"},
	{"id":"each","type":"loop","data":{"until":"steps.echo.output.n < 0","maxIterations":6,"body":{"name":"b","nodes":[
		{"id":"start","type":"trigger"},
		{"id":"hold","type":"wait","data":{"signal":"tick"}},
		{"id":"echo","type":"tool","data":{"tool":"echo","input":{"n":"{{steps.hold.output.n}}"}}}],
		"edges":[{"from":"start","to":"hold"},{"from":"hold","to":"echo"}]}}}],
	"edges":[{"from":"start","to":"each"}]}`

// TestRedriveFoldsOnlyWhatCameAfterThePark: a run that parks again and
// again (a wait per loop iteration) is driven each time from the state its
// worker kept, folding only the signal that woke it, and ends as a fold of
// the whole journal says.
func TestRedriveFoldsOnlyWhatCameAfterThePark(t *testing.T) {
	t.Parallel()
	s := paltest.New(t)
	w := s.Worker(t, "w1")
	driveTicks(t, s)
	// Every wake after the first park started from the kept state.
	require.GreaterOrEqual(t, workers.FoldedHits(w), 5)
}

// TestKeptStateBehindAnotherWorkersDrives: with two workers taking the
// wakes in turn, a kept state is often behind what the other worker
// journaled since; folding what came after its head still ends the run as
// a fold of the whole journal says.
func TestKeptStateBehindAnotherWorkersDrives(t *testing.T) {
	t.Parallel()
	s := paltest.New(t)
	w1, w2 := s.Worker(t, "w1"), s.Worker(t, "w2")
	driveTicks(t, s)
	t.Logf("drives from a kept state: w1 %d, w2 %d", workers.FoldedHits(w1), workers.FoldedHits(w2))
}

// driveTicks runs waitLoopWorkflow to its end, signalling each wait as it
// parks, and checks the journal folds to the expected result.
func driveTicks(t *testing.T, s *paltest.Stack) {
	t.Helper()
	runID := s.Start(t, waitLoopWorkflow, `{}`)
	ctx := context.Background()
	for i := range 6 {
		hold := engine.NodeStep("each").InIteration(i, "hold").String()
		s.WaitFor(t, runID, "the wait of "+hold, func(ev event.Event) bool {
			return ev.Kind == event.StepWaiting && ev.StepID == hold
		})
		require.NoError(t, s.Runs.Signal(ctx, runs.SignalCommand{RunID: runID, Signal: "tick",
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), By: "test"}))
	}
	end := s.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	st, err := engine.Fold(s.Events(t, runID))
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, st.Status)
	require.JSONEq(t, `{"iterations":6,"results":[{"n":0},{"n":1},{"n":2},{"n":3},{"n":4},{"n":5}],"stopped":"max_iterations"}`,
		string(st.Steps["each"].Output))
}
