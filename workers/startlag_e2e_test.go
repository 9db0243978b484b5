package workers_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// TestStartWorkBeforeItsJournalWaitsForIt: a start publishes its work
// message beside run_created (docs/architecture.md §8), so a worker may
// take the work before the journal shows the run. It looks again shortly
// rather than dropping the work, and drives the run once run_created is
// there.
func TestStartWorkBeforeItsJournalWaitsForIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logs := b.captureLogs(t)
	b.worker(t, "w1", map[string]workers.Tool{"echo": func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		return in, nil
	}})
	runID := event.NewRunID()
	require.NoError(t, b.Store.Enqueue(ctx, "", runID, "start"))
	require.Eventually(t, func() bool {
		return strings.Count(logs.String(), "start's work came before its run_created") >= 3
	}, 10*time.Second, 5*time.Millisecond, "the worker looks again, 20 ms and then 40 ms on")
	pending, err := b.Store.WorkPending(ctx, "", runID)
	require.NoError(t, err)
	require.True(t, pending, "the work waits for its run_created")

	res, err := b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(echoChain(1))})
	require.NoError(t, err)
	require.True(t, res.Created)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	require.NotContains(t, logs.String(), "work for a run with no journal")
}
