package engine_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// TestSettledMemoDecidesAsAFreshWalk: Frontier on a state that has been
// asked at every event (so it carries the memo of its settled nodes)
// decides what Frontier decides on a fresh fold of the same events given
// a copy of the workflow, which it walks whole (the memo is kept for the
// run's own workflow only), at every point of every saved journal.
func TestSettledMemoDecidesAsAFreshWalk(t *testing.T) {
	t.Parallel()
	eachHistory(t, func(t *testing.T, _ string, evs []event.Event) {
		var created event.RunCreatedData
		require.NoError(t, json.Unmarshal(evs[0].Data, &created))
		// A workflow that does not parse leaves both states without one.
		copied, err := workflow.Parse(created.Workflow)
		if err != nil {
			copied = nil
		}
		st := &engine.RunState{}
		busy := map[string]bool{}
		for i, ev := range evs {
			require.NoError(t, st.Apply(ev))
			trackBusy(busy, ev)
			fresh := &engine.RunState{}
			for _, e := range evs[:i+1] {
				require.NoError(t, fresh.Apply(e))
			}
			ctx := context.Background()
			require.Equal(t,
				engine.Frontier(ctx, copied, fresh, ev.TS, busy),
				engine.Frontier(ctx, st.Workflow, st, ev.TS, busy),
				"seq %d (%s %s)", ev.Seq, ev.Kind, ev.StepID)
		}
	})
}
