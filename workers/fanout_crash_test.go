package workers_test

// A run with steps in flight at once, broken: the `pal worker` driving
// a parallel loop or parallel sub-agents is killed with kill -9, or
// frozen with SIGSTOP mid-fan-out.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider/providertest"
)

// TestKill9ParallelLoopResendsOnlyTheUnfinished: a loop over 50 items
// with concurrency 10 whose body is one held ai-step (in a run whose
// limit, policy.concurrency, is above it). Ten are in flight,
// never more; the worker is killed when 30 have completed, and after the
// takeover exactly the 20 unfinished items reach the provider, the ten
// that were in flight with the keys they had; the output keeps the
// items' order.
func TestKill9ParallelLoopResendsOnlyTheUnfinished(t *testing.T) {
	t.Parallel()
	const n, par = 50, 10
	p := setupProc(t, time.Second)
	runID := event.NewRunID()
	ask := func(i int) string { return fmt.Sprintf("each[%d].ask", i) }
	holds := make([]*providertest.Hold, n)
	for i := range holds {
		holds[i] = p.LLM.Hold(providertest.ByKey(key(runID, ask(i), 1)))
	}
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprint(i)
	}
	wf := fmt.Sprintf(`{"name":"each","nodes":[{"id":"start","type":"trigger"},
		{"id":"each","type":"loop","data":{"over":"{{input.xs}}","concurrency":%d,"body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
			{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"item {{input.item}}"}}],
			"edges":[{"from":"start","to":"ask"}]}}}],"edges":[{"from":"start","to":"each"}],
		"policy":{"concurrency":16}}`, par)
	w1 := p.palWorker(t, "w1")
	p.startAs(t, runID, wf, `{"xs":[`+strings.Join(items, ",")+`]}`)
	ctx := ctxFor(t, 2*time.Minute)
	for i := range par {
		_, err := holds[i].Wait(ctx)
		require.NoError(t, err, w1.Output())
	}
	require.Equal(t, par, p.LLM.InFlight())
	for i := range 30 {
		holds[i].Release()
		_, err := holds[i+par].Wait(ctx) // one finished: the next starts
		require.NoError(t, err, w1.Output())
		require.LessOrEqual(t, p.LLM.InFlight(), par)
	}
	require.Eventually(t, func() bool {
		done := 0
		for _, ev := range find(p.Events(t, runID), event.StepCompleted, "") {
			if strings.HasSuffix(ev.StepID, ".ask") {
				done++
			}
		}
		return done == 30
	}, time.Minute, 20*time.Millisecond)
	require.Equal(t, par, p.LLM.MaxConcurrent(), "ten in flight, never more")

	w1.Kill() // items 30–39 are in flight, 40–49 not started
	require.Eventually(t, func() bool { return p.LLM.InFlight() == 0 }, time.Minute, 10*time.Millisecond)
	p.LLM.Reset()
	p.palWorker(t, "w2")
	for i := 30; i < 40; i++ {
		_, err := holds[i].Wait(ctx) // sent again after the takeover
		require.NoError(t, err)
	}
	for i := 30; i < n; i++ {
		holds[i].Release()
	}
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind)
	want := map[string]int{}
	for i := 30; i < n; i++ {
		want[key(runID, ask(i), 1)] = 1
	}
	require.Equal(t, want, p.LLM.Keys(), "exactly the twenty unfinished, each with its own key")
	require.LessOrEqual(t, p.LLM.MaxConcurrent(), par)

	var out engine.LoopOutput
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &out))
	require.Equal(t, n, out.Iterations)
	for i, r := range out.Results {
		require.JSONEq(t, fmt.Sprintf(`"echo: item %d"`, i), string(mustField(t, r, "text")), "item %d in its place", i)
	}
	evs := p.Events(t, runID)
	for i := range n {
		require.Len(t, find(evs, event.StepCompleted, ask(i)), 1, ask(i))
	}
}

// TestKill9ParallelSubagents: a loop of five subagent children with
// concurrency 5: the five child runs are in flight at once; the parent's
// worker is killed; every child finishes exactly once and the parent
// succeeds.
func TestKill9ParallelSubagents(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	child := `{"name":"child","nodes":[{"id":"start","type":"trigger"},
		{"id":"think","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"child {{input.n}}"}}],
		"edges":[{"from":"start","to":"think"}]}`
	wf := `{"name":"kids","nodes":[{"id":"start","type":"trigger"},
		{"id":"kids","type":"loop","data":{"over":"{{input.xs}}","concurrency":5,"body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
			{"id":"kid","type":"subagent","data":{"workflow":` + child + `,"input":{"n":"{{input.item}}"}}}],
			"edges":[{"from":"start","to":"kid"}]}}}],"edges":[{"from":"start","to":"kids"}]}`
	runID := event.NewRunID()
	children := make([]string, 5)
	keys := map[string]bool{}
	for i := range children {
		children[i] = event.ChildRunID(runID, fmt.Sprintf("kids[%d].kid", i))
		keys[key(children[i], "think", 1)] = true
	}
	hold := p.LLM.Hold(func(c providertest.Call) bool { return keys[c.IdempotencyKey] })
	w1 := p.palWorker(t, "w1")
	p.startAs(t, runID, wf, `{"xs":[0,1,2,3,4]}`)
	ctx := ctxFor(t, 2*time.Minute)
	for range 5 {
		_, err := hold.Wait(ctx)
		require.NoError(t, err, w1.Output())
	}
	require.Equal(t, 5, p.LLM.InFlight(), "five child runs in flight at once")
	w1.Kill()
	p.palWorker(t, "w2")
	hold.Release()

	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind)
	var out engine.LoopOutput
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &out))
	require.Len(t, out.Results, 5)
	j := testenv.ReadJournal(t, p.NC)
	for i, id := range children {
		require.JSONEq(t, fmt.Sprintf(`"echo: child %d"`, i), string(mustField(t, out.Results[i], "text")))
		require.Len(t, find(j[id], event.RunCreated, ""), 1, "one child run %d", i)
		require.Len(t, find(j[id], event.RunSucceeded, ""), 1, "child %d finished once", i)
		require.Len(t, find(j[id], event.StepCompleted, "think"), 1, "child %d's step completed once", i)
		require.LessOrEqual(t, p.LLM.Keys()[key(id, "think", 1)], 2, "child %d's call sent again at most once, with its key", i)
		require.Len(t, find(j[runID], event.StepCompleted, fmt.Sprintf("kids[%d].kid", i)), 1)
	}
	var created int
	for _, evs := range j {
		if data[event.RunCreatedData](t, evs[0]).ParentRunID == runID {
			created++
		}
	}
	require.Equal(t, 5, created, "no other child")
}

// TestFrozenWorkerFanOutAppendsNothing: a worker frozen with four
// branches in flight loses the run; when it wakes, the late results of
// its branches are fenced out of the journal.
func TestFrozenWorkerFanOutAppendsNothing(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	runID := event.NewRunID()
	keys := keysOf(runID, branches(4)...)
	hold := p.LLM.Hold(func(c providertest.Call) bool { return keys[c.IdempotencyKey] })
	w1 := p.palWorker(t, "w1")
	p.startAs(t, runID, fanOutWorkflow(4, true, ""), `{"topic":"freeze"}`)
	ctx := ctxFor(t, time.Minute)
	for range 4 {
		_, err := hold.Wait(ctx)
		require.NoError(t, err)
	}
	require.NoError(t, w1.Stop()) // SIGSTOP: frozen past its lease
	p.palWorker(t, "w2")
	hold.Release() // both workers' calls may now complete; w1 is frozen
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	before := p.Events(t, runID)

	require.NoError(t, w1.Cont())
	require.NoError(t, w1.WaitForOutput(ctxFor(t, 30*time.Second), "drive interrupted"), w1.Output())
	require.Equal(t, before, p.Events(t, runID), "the frozen worker appended after losing the run")
	seen := false
	for _, ev := range before {
		if ev.Kind == event.RunResumed && ev.WorkerID == "w2" {
			seen = true
		}
		if seen {
			require.NotEqual(t, "w1", ev.WorkerID, "seq %d %s", ev.Seq, ev.Kind)
		}
	}
	for _, b := range branches(4) {
		require.Len(t, find(before, event.StepCompleted, b), 1, b)
	}
}
