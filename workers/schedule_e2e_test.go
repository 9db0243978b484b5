package workers_test

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
)

// echoOnce is a workflow a schedule starts: one echo step, done in
// milliseconds.
const echoOnce = `{"name":"tick-echo","nodes":[{"id":"start","type":"trigger"},{"id":"e","type":"tool","data":{"tool":"echo","input":{"n":"{{input.n}}"}}}],"edges":[{"from":"start","to":"e"}]}`

// scheduleRuns reads every run in PAL_EVENTS that schedule name started,
// by tick, and checks each: its id is the tick's (event.ScheduleRunID)
// and its journal holds one run_created.
func scheduleRuns(t *testing.T, p *procBundle, name string) map[time.Time]string {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	s, err := p.JS.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(eventstore.EventsPrefix+"*"))
	require.NoError(t, err)
	out := map[time.Time]string{}
	for subj := range info.State.Subjects {
		runID := strings.TrimPrefix(subj, eventstore.EventsPrefix)
		first, err := p.Store.FirstEvent(ctx, runID)
		require.NoError(t, err)
		var c event.RunCreatedData
		require.NoError(t, first.DecodeData(&c))
		if c.Schedule != name {
			continue
		}
		tick, err := time.Parse(time.RFC3339Nano, c.Tick)
		require.NoError(t, err)
		require.Equal(t, event.ScheduleRunID(name, tick), runID, "the run id is the tick's")
		_, dup := out[tick]
		require.False(t, dup, "two runs for tick %s", tick)
		out[tick] = runID
		require.Len(t, find(p.Events(t, runID), event.RunCreated, ""), 1, "run %s created once", runID)
	}
	return out
}

// ticksOf sorts the ticks of runs.
func ticksOf(m map[time.Time]string) []time.Time {
	out := make([]time.Time, 0, len(m))
	for t := range m {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// requireEveryTick checks that ticks are every's, one after another with
// none missing, from the first to the last.
func requireEveryTick(t *testing.T, ticks []time.Time, every time.Duration) {
	t.Helper()
	for i := 1; i < len(ticks); i++ {
		require.Equal(t, every, ticks[i].Sub(ticks[i-1]), "a gap or a stray tick between %s and %s (ticks %v)", ticks[i-1], ticks[i], ticks)
	}
}

// waitTicks waits until schedule name has at least n runs.
func waitTicks(t *testing.T, p *procBundle, name string, n int, within time.Duration) map[time.Time]string {
	t.Helper()
	var got map[time.Time]string
	require.Eventually(t, func() bool {
		got = scheduleRuns(t, p, name)
		return len(got) >= n
	}, within, 250*time.Millisecond, "schedule %s: %d runs, want %d", name, len(got), n)
	var lag time.Duration
	for tick, runID := range got {
		first, err := p.Store.FirstEvent(context.Background(), runID)
		require.NoError(t, err)
		lag = max(lag, first.TS.Sub(tick))
	}
	t.Logf("schedule %s: %d runs, each run_created at most %s after its tick", name, len(got), lag)
	return got
}

// TestScheduleEveryTwoSecondsTwoWorkers: a schedule every 2 s with two
// `pal worker` processes, both firing every tick. Over ~20 s each tick
// has exactly one run, under the tick's id, with no gap, also across a
// kill -9 of one worker halfway; pause stops the runs, resume starts them
// again.
func TestScheduleEveryTwoSecondsTwoWorkers(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 3*time.Minute)
	p.Deploy(t, echoOnce)
	w1 := p.palWorker(t, "w1")
	w2 := p.palWorker(t, "w2")
	c := runs.New(p.Store)
	sc, err := c.CreateSchedule(ctx, runs.ScheduleCommand{Name: "every2", Every: "2s", Workflow: "tick-echo",
		Input: json.RawMessage(`{"n":"x"}`), Overlap: runs.OverlapAllow, Rights: runs.AllRights})
	require.NoError(t, err)
	require.Equal(t, runs.CatchupOne, sc.Catchup)

	waitTicks(t, p, "every2", 3, 30*time.Second)
	w1.Kill() // kill -9, mid-schedule
	got := waitTicks(t, p, "every2", 6, 40*time.Second)
	ticks := ticksOf(got)
	require.Equal(t, sc.Created.Add(2*time.Second), ticks[0], "the first tick is the first after the schedule's creation")
	requireEveryTick(t, ticks, 2*time.Second)
	for _, runID := range got {
		require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	}
	require.Contains(t, w2.Output(), "worker ready")

	// Pause: no tick after it gets a run.
	paused, err := c.PauseSchedule(ctx, runs.ScheduleNameCommand{Name: "every2", Rights: runs.AllRights})
	require.NoError(t, err)
	require.True(t, paused.Paused)
	require.Nil(t, paused.Next)
	pausedAt := time.Now()
	time.Sleep(5 * time.Second) // two and a half ticks: what is awaited is that nothing happens
	atPause := scheduleRuns(t, p, "every2")
	for tick := range atPause {
		require.False(t, tick.After(pausedAt), "tick %s after the pause (%s) got a run", tick, pausedAt)
	}
	requireEveryTick(t, ticksOf(atPause), 2*time.Second)

	// Resume: ticks after it get runs again, none of the paused ones.
	resumed, err := c.ResumeSchedule(ctx, runs.ScheduleNameCommand{Name: "every2", Rights: runs.AllRights})
	require.NoError(t, err)
	require.False(t, resumed.Paused)
	after := waitTicks(t, p, "every2", len(atPause)+2, 20*time.Second)
	var fresh []time.Time
	for tick := range after {
		if _, old := atPause[tick]; !old {
			require.True(t, tick.After(resumed.LastTick.Add(-time.Nanosecond)), "tick %s is from the pause", tick)
			fresh = append(fresh, tick)
		}
	}
	sort.Slice(fresh, func(i, j int) bool { return fresh[i].Before(fresh[j]) })
	requireEveryTick(t, fresh, 2*time.Second)
	require.NoError(t, c.DeleteSchedule(ctx, runs.ScheduleNameCommand{Name: "every2", Rights: runs.AllRights}))
}

// TestScheduleCatchupOneAfterDowntime: a schedule every 2 s whose only
// worker is killed; after 10 s with no worker, the next worker fires one
// run for all the ticks missed (the latest), then every tick again.
func TestScheduleCatchupOneAfterDowntime(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 3*time.Minute)
	p.Deploy(t, echoOnce)
	w1 := p.palWorker(t, "w1")
	c := runs.New(p.Store)
	_, err := c.CreateSchedule(ctx, runs.ScheduleCommand{Name: "catchup1", Every: "2s", Workflow: "tick-echo",
		Catchup: runs.CatchupOne, Overlap: runs.OverlapAllow, Rights: runs.AllRights})
	require.NoError(t, err)
	waitTicks(t, p, "catchup1", 2, 30*time.Second)
	w1.Kill()
	time.Sleep(10 * time.Second) // the downtime: no worker runs
	before := scheduleRuns(t, p, "catchup1")
	last := ticksOf(before)[len(before)-1]
	restart := time.Now()
	p.palWorker(t, "w2")
	got := waitTicks(t, p, "catchup1", len(before)+3, 30*time.Second)

	var later []time.Time
	for _, tick := range ticksOf(got) {
		if tick.After(last) {
			later = append(later, tick)
		}
	}
	catchup := later[0]
	// The one run for the downtime is its latest tick: none of the four
	// or more before it has a run.
	require.GreaterOrEqual(t, catchup.Sub(last), 8*time.Second, "ticks %v after %s", later, last)
	require.False(t, catchup.Before(restart.Add(-2*time.Second)), "the catch-up is the latest missed tick (restart %s, ticks %v)", restart, later)
	requireEveryTick(t, later, 2*time.Second) // every tick since, none missing
}
