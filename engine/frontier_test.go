package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// TestNextIsTheFrontiersFirst: Next gives the first step of the set
// Frontier gives with nothing busy.
func TestNextIsTheFrontiersFirst(t *testing.T) {
	t.Parallel()
	h := newHistory(t, event.NewRunID(), wfFanOut, inputFanOut).resume("w")
	rs, ok := engine.Frontier(context.Background(), h.st.Workflow, h.st, h.now, nil).(engine.RunSteps)
	require.True(t, ok)
	require.Len(t, rs.Plans, 3)
	next, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.RunStep)
	require.True(t, ok)
	require.Equal(t, rs.Plans[0], next.Plan)
}

// TestToolCallsOneAtATime: an agent with parallelToolCalls false runs a
// turn's calls one after another, as before.
func TestToolCallsOneAtATime(t *testing.T) {
	t.Parallel()
	wf := strings.Replace(wfAgent, `"maxTurns":10`, `"maxTurns":10,"parallelToolCalls":false`, 1)
	h := newHistory(t, event.NewRunID(), wf, `{"q":"pal"}`).resume("w")
	h.turn("ask.turn[0]", provider2{"lookup", `{"q":"a"}`}, provider2{"lookup", `{"q":"b"}`})
	require.Equal(t, []string{"ask.turn[0].tool[0]"}, h.ready())
	h.start("ask.turn[0].tool[0]")
	require.Empty(t, h.ready())
	h.complete("ask.turn[0].tool[0]", `{}`, nil)
	require.Equal(t, []string{"ask.turn[0].tool[1]"}, h.ready())
}

// TestInterruptedStepFailsOnlyAsAFallback: a journal whose drive died
// between the interrupted steps and run_failed still fails the run at
// the step that failed it, wherever it is in the graph; interrupted
// steps alone fail it at the first of them rather than send it again.
func TestInterruptedStepFailsOnlyAsAFallback(t *testing.T) {
	t.Parallel()
	h := fanOut(t, event.NewRunID(), wfFanOut)
	require.False(t, h.failTry("c", "openai: 400 Bad Request", event.ClassLLM, false, false, 0))
	h.interrupt("a", "c").interrupt("b", "c")
	f, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.Fail)
	require.True(t, ok)
	require.Equal(t, "c", f.StepID, "the failure, not the interrupted a before it")

	h = fanOut(t, event.NewRunID(), wfFanOut)
	h.append(event.StepFailed, "b", 1, event.StepFailedData{Error: "interrupted", Class: event.ClassInterrupted, OutcomeUnknown: true, InterruptedBy: "x"})
	f, ok = engine.Next(h.st.Workflow, h.st, h.now).(engine.Fail)
	require.True(t, ok)
	require.Equal(t, "b", f.StepID)
}

// TestParallelLoopWindow drives a loop of 20 items with concurrency 4,
// its iterations ending in a random order: never more than 4 are in
// progress, every Frontier fills the window, and the results keep the
// items' order.
func TestParallelLoopWindow(t *testing.T) {
	t.Parallel()
	const n, par = 20, 4
	wf := strings.Replace(wfParallelLoop, `"concurrency":2`, fmt.Sprintf(`"concurrency":%d`, par), 1)
	xs := make([]string, n)
	for i := range xs {
		xs[i] = fmt.Sprint(100 + i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	h := newHistory(t, event.NewRunID(), wf, `{"xs":[`+strings.Join(xs, ",")+`]}`).resume("w")
	next := 0 // the lowest iteration not started
	for {
		ready := h.ready()
		if len(ready) == 1 && ready[0] == "each" {
			break
		}
		for _, id := range ready {
			require.Equal(t, fmt.Sprintf("each[%d].ask", next), id, "iterations start in order")
			h.start(id)
			next++
		}
		require.LessOrEqual(t, len(h.busy), par, "never more than %d in progress", par)
		if next < n {
			require.Len(t, h.busy, par, "the window is full")
		}
		in := make([]string, 0, len(h.busy))
		for id := range h.busy {
			in = append(in, id)
		}
		slices.Sort(in)
		id := in[rng.IntN(len(in))]
		h.llmEnd(id, "r"+id, "gpt-4o-mini", 3, 1)
	}
	var out engine.LoopOutput
	require.NoError(t, json.Unmarshal(h.plan("each").Output, &out))
	require.Len(t, out.Results, n)
	for i, r := range out.Results {
		require.Contains(t, string(r), fmt.Sprintf(`"text":"reach[%d].ask"`, i))
	}
}

// TestBusyStepsReserveTheBudget: steps in flight hold their worst case,
// so a third that does not fit beside them is held (an empty set), not
// noted, and Next with nothing busy sends the two again before it.
func TestBusyStepsReserveTheBudget(t *testing.T) {
	t.Parallel()
	wf := withPolicy(t, wfFanOut, `{"budget":{"maxTokens":300}}`)
	h := newStarted(t, event.NewRunID(), wf, inputFanOut, nil).resume("w")
	h.start("a").start("b")
	rs, ok := engine.Frontier(context.Background(), h.st.Workflow, h.st, h.now, h.busy).(engine.RunSteps)
	require.True(t, ok)
	require.Empty(t, rs.Plans, "c waits for what is in flight")
	next, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.RunStep)
	require.True(t, ok)
	require.Equal(t, "a", next.Plan.StepID)
	require.True(t, next.Plan.Started)
	require.Equal(t, []string{"a", "b"}, readyOf(t, h, nil), "a drive resuming the run sends a and b again, not c")
}

func readyOf(t *testing.T, h *history, busy map[string]bool) []string {
	t.Helper()
	rs, ok := engine.Frontier(context.Background(), h.st.Workflow, h.st, h.now, busy).(engine.RunSteps)
	require.True(t, ok)
	var ids []string
	for _, p := range rs.Plans {
		ids = append(ids, p.StepID)
	}
	return ids
}

// TestOutputCapsInASet: each LLM step of a set gets its output cap from
// what the journal leaves (not from what the steps beside it reserve),
// and one whose cap does not fit beside them waits for them (an empty
// set, no budget_exceeded), then goes with the room their usage left.
func TestOutputCapsInASet(t *testing.T) {
	t.Parallel()
	uncapped := strings.ReplaceAll(wfFanOut, `"maxTokens":100,`, "")
	capOf := func(p engine.StepPlan) int {
		var in engine.AIInput
		require.NoError(t, json.Unmarshal(p.Input, &in))
		return in.MaxTokens
	}
	plans := func(h *history) []engine.StepPlan {
		rs, ok := engine.Frontier(context.Background(), h.st.Workflow, h.st, h.now, h.busy).(engine.RunSteps)
		require.True(t, ok)
		return rs.Plans
	}

	// Room for two default caps, not three: a and b go, c is cut.
	h := newStarted(t, event.NewRunID(), withPolicy(t, uncapped, `{"budget":{"maxTokens":10000}}`), inputFanOut, nil).resume("w")
	ps := plans(h)
	require.Len(t, ps, 2)
	require.Equal(t, []int{engine.DefaultOutputTokens, engine.DefaultOutputTokens}, []int{capOf(ps[0]), capOf(ps[1])})

	// Room for one: b's cap is not shrunk to fit beside a; b waits.
	h = newStarted(t, event.NewRunID(), withPolicy(t, uncapped, `{"budget":{"maxTokens":5000}}`), inputFanOut, nil).resume("w")
	ps = plans(h)
	require.Len(t, ps, 1)
	require.Equal(t, "a", ps[0].StepID)
	require.Equal(t, engine.DefaultOutputTokens, capOf(ps[0]))
	h.start("a")
	require.Empty(t, plans(h), "b waits for a, with no note")
	h.llmEnd("a", "A", "gpt-4o-mini", 28, 9)
	ps = plans(h)
	require.Equal(t, "b", ps[0].StepID)
	require.Equal(t, engine.DefaultOutputTokens, capOf(ps[0]), "a spent little: b has its full cap")
	h.start("b")
	require.Empty(t, plans(h), "c waits for b")
	h.llmEnd("b", "B", "gpt-4o-mini", 28, 3000)
	ps = plans(h)
	require.Equal(t, "c", ps[0].StepID)
	room := capOf(ps[0])
	require.Less(t, room, engine.DefaultOutputTokens, "b spent most: c's cap is the room left")
	require.GreaterOrEqual(t, room, engine.MinOutputRoom)
	need, _, _ := engine.EstimateCall(ps[0].Input, nil)
	require.LessOrEqual(t, need+float64(h.st.Spent().Tokens), 5000.0, "c's worst case fits the budget")
}
