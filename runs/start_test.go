package runs_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

// A start with an idempotency key that finds its run id taken is the same
// start only if the run's run_created carries that key; a run made with
// no key, or another key, refuses it (ErrRunExists, conflict).
func TestStartWithKeyIsADuplicateOnlyOfTheSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := json.RawMessage(echoChain(1))
	start := func(runID, key string) (runs.StartResult, error) {
		return b.Runs.Start(ctx, runs.StartCommand{Workflow: wf, RunID: runID, IdempotencyKey: key})
	}

	res, err := start("run_same", "")
	require.NoError(t, err)
	require.True(t, res.Created)
	_, err = start("run_same", "other")
	require.ErrorIs(t, err, runs.ErrRunExists, "a run made with no key is not this start")
	code, _, _ := runs.Classify(err)
	require.Equal(t, runs.CodeConflict, code)

	res, err = start("run_keyed", "k1")
	require.NoError(t, err)
	require.True(t, res.Created)
	res, err = start("run_keyed", "k1")
	require.NoError(t, err, "the same start again")
	require.Equal(t, runs.StartResult{RunID: "run_keyed", Created: false}, res)
	_, err = start("run_keyed", "k2")
	require.ErrorIs(t, err, runs.ErrRunExists, "a run made with another key is not this start")

	// A run that took a key's derived run id without the key is not the
	// key's start either.
	_, err = start(runs.RunIDForKey("k3"), "")
	require.NoError(t, err)
	_, err = start("", "k3")
	require.ErrorIs(t, err, runs.ErrRunExists)

	for _, id := range []string{"run_same", "run_keyed", runs.RunIDForKey("k3")} {
		require.Len(t, find(b.Events(t, id), event.RunCreated, ""), 1, id)
	}
}
