package workers_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/workers"
)

// fakeClock is a worker clock the test sets by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// TestApprovalTimeoutFollowsTheInjectedClock: an approval's deadline is
// the worker clock's now plus timeoutMs, and the drive times it out when
// that clock, not the wall, passes it. Every event the worker writes
// carries the clock's time.
func TestApprovalTimeoutFollowsTheInjectedClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t0 := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	clk := &fakeClock{t: t0}
	w := workers.New(workers.Config{ID: "clocked", Clock: clk.Now, Logger: paltest.Logger(t)}, b.Store, b.Leases, nil, nil)
	wf := `{"name":"hour","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{"timeoutMs":3600000}},
		{"id":"yes","type":"tool","data":{"tool":"echo","input":{"r":"yes"}}},{"id":"late","type":"tool","data":{"tool":"echo","input":{"r":"late"}}}],
		"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"yes","condition":"steps.ok.output.approved"},
		{"from":"ok","to":"late","condition":"steps.ok.output.timed_out"}]}`
	runID := b.Start(t, wf, `{}`)
	ctx := ctxFor(t, 30*time.Second)

	require.NoError(t, w.Drive(ctx, runID))
	evs := b.Events(t, runID)
	waits := find(evs, event.StepWaiting, "ok")
	require.Len(t, waits, 1)
	require.Equal(t, t0.Add(time.Hour).Format(time.RFC3339Nano), data[event.StepWaitingData](t, waits[0]).TimeoutAt)

	// A minute before the deadline by the clock the run stays parked: the
	// drive appends nothing.
	clk.Set(t0.Add(59 * time.Minute))
	require.NoError(t, w.Drive(ctx, runID))
	require.Len(t, b.Events(t, runID), len(evs))

	// At the deadline by the clock (the wall has not moved an hour) the
	// approval times out and the run goes along the timed_out edge.
	clk.Set(t0.Add(time.Hour))
	require.NoError(t, w.Drive(ctx, runID))
	evs = b.Events(t, runID)
	require.Equal(t, event.RunSucceeded, evs[len(evs)-1].Kind)
	done := find(evs, event.StepCompleted, "ok")
	require.Len(t, done, 1)
	require.JSONEq(t, `{"approved":false,"decision":"timeout","timed_out":true}`, string(data[event.StepCompletedData](t, done[0]).Output))
	require.Equal(t, t0.Add(time.Hour), done[0].TS)
	require.Len(t, find(evs, event.StepCompleted, "late"), 1)
	require.Empty(t, find(evs, event.StepStarted, "yes"))
	for _, ev := range evs {
		if ev.WorkerID != "clocked" {
			continue
		}
		require.True(t, ev.TS.Equal(t0) || ev.TS.Equal(t0.Add(time.Hour)), "seq %d %s stamped %s, not by the clock", ev.Seq, ev.Kind, ev.TS)
	}

	// A replay decides the same: the journal folds to the end it recorded.
	st, err := engine.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, st.Status)
	require.Equal(t, engine.Done{Status: engine.StatusSucceeded}, engine.Next(st.Workflow, st, t0))
}
