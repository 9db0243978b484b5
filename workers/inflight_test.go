package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/workers"
)

// TestInflightSourceReadsOnlyRunsInFlight: finished runs leave the index,
// so a sweep pass reads the runs in flight however many have finished; an
// entry left by a lost purge is removed by the next pass, and a parked run
// is no candidate.
func TestInflightSourceReadsOnlyRunsInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 30 {
		b.WaitEnd(t, b.Start(t, echoChain(2), `{}`))
	}
	require.Eventually(t, func() bool {
		left, err := b.Store.InflightRuns(ctx)
		return err == nil && len(left) == 0
	}, 10*time.Second, 10*time.Millisecond, "finished runs stay in the index")

	// A finished run whose purge was lost: indexed again by hand.
	done := b.Start(t, echoChain(1), `{}`)
	b.WaitEnd(t, done)
	require.NoError(t, b.Store.MarkInflight("", done)(ctx))
	// A parked run.
	gate := b.Start(t, gateWF, `{}`)
	b.WaitFor(t, gate, "step_waiting", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })

	src := workers.NewInflightSource(b.Store)
	ids, err := src.Orphans(ctx, 200)
	require.NoError(t, err)
	require.Empty(t, ids, "a finished or parked run is no orphan")
	left, err := b.Store.InflightRuns(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{gate}, runIDsOf(left), "the finished run's entry was not removed")
}

const gateWF = `{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval"},
	{"id":"done","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"done"}]}`

func runIDsOf(es []eventstore.Inflight) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.RunID
	}
	return out
}
