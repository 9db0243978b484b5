package engine_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// requireIncrementalFold folds evs one event at a time, asking Next after
// each (so its memos build up as in a drive), and checks at every prefix
// that the state and Next's decision equal those of a fold from scratch.
func requireIncrementalFold(t *testing.T, evs []event.Event) {
	t.Helper()
	inc := &engine.RunState{}
	// snap is inc encoded and decoded every third event, folding on in
	// between: a snapshot and its tail must fold to the same state.
	var snap *engine.RunState
	for i, ev := range evs {
		require.NoError(t, inc.Apply(ev), "seq %d", ev.Seq)
		if snap != nil {
			require.NoError(t, snap.Apply(ev), "seq %d after a snapshot", ev.Seq)
		}
		if i%3 == 0 {
			b, err := engine.EncodeState(inc)
			require.NoError(t, err)
			snap, err = engine.DecodeState(b)
			require.NoError(t, err)
		}
		scratch, err := engine.Fold(evs[:i+1])
		require.NoError(t, err)
		at := fmt.Sprintf("after seq %d (%s %s)", ev.Seq, ev.Kind, ev.StepID)
		now := ev.TS.Add(time.Second)
		require.Equal(t, engine.Next(scratch.Workflow, scratch, now), engine.Next(inc.Workflow, inc, now), at)
		require.Equal(t, engine.Comparable(scratch), engine.Comparable(inc), at)
		require.Equal(t, engine.Next(scratch.Workflow, scratch, now), engine.Next(snap.Workflow, snap, now), at+" from a snapshot")
		require.Equal(t, engine.Comparable(scratch), engine.Comparable(snap), at+" from a snapshot")
	}
}

// TestIncrementalFoldEqualsScratch: every golden history, and runs with
// loops (over, until, nested, a retry, a crash mid-loop) and an agent in a
// loop, fold to the same state and the same next action event by event as
// from scratch.
func TestIncrementalFoldEqualsScratch(t *testing.T) {
	t.Parallel()
	eachHistory(t, func(t *testing.T, _ string, evs []event.Event) {
		requireIncrementalFold(t, evs)
	})
	t.Run("loop_over_with_retry_and_crash", func(t *testing.T) {
		t.Parallel()
		items := make([]string, 30)
		for i := range items {
			items[i] = fmt.Sprint("u", i)
		}
		in, _ := json.Marshal(map[string]any{"urls": items, "tag": "t"})
		wf := strings.Replace(wfLoop, `"tool":"http",`, `"tool":"http","retry":{"maxAttempts":2,"retryableClasses":["any"]},`, 1)
		require.NotEqual(t, wfLoop, wf)
		h := newHistory(t, testRun, wf, string(in)).resume("w")
		for i := range items {
			f, s := fmt.Sprintf("each[%d].fetch", i), fmt.Sprintf("each[%d].sum", i)
			h.start(f)
			if i == 7 {
				require.True(t, h.failTry(f, "503", event.ClassTool, true, false, time.Second))
				h.start(f)
			}
			if i == 12 {
				h.resume("w2") // a crash mid-iteration
			}
			h.complete(f, fmt.Sprintf(`{"n":%d}`, i), nil).start(s).complete(s, fmt.Sprintf(`{"got":%d}`, i), nil)
		}
		h.pure("each").start("after").complete("after", `{"n":30}`, nil)
		requireIncrementalFold(t, h.finish().events())
	})
	t.Run("nested_loops_until", func(t *testing.T) {
		t.Parallel()
		wf := `{"name":"nest","nodes":[{"id":"start","type":"trigger"},
			{"id":"outer","type":"loop","data":{"maxIterations":4,"until":"steps.inner.output.iterations > 9","body":{"name":"o","nodes":[
				{"id":"start","type":"trigger"},
				{"id":"inner","type":"loop","data":{"until":"steps.t.output.k >= 2","maxIterations":5,"body":{"name":"i","nodes":[
					{"id":"start","type":"trigger"},
					{"id":"t","type":"tool","data":{"tool":"echo","input":{"k":"{{input.index}}"}}}],
					"edges":[{"from":"start","to":"t"}]}}}],
				"edges":[{"from":"start","to":"inner"}]}}}],
			"edges":[{"from":"start","to":"outer"}]}`
		h := newHistory(t, testRun, wf, `{}`).resume("w")
		for o := range 4 {
			for k := range 3 {
				id := fmt.Sprintf("outer[%d].inner[%d].t", o, k)
				h.start(id).complete(id, fmt.Sprintf(`{"k":%d}`, k), nil)
			}
			h.pure(fmt.Sprintf("outer[%d].inner", o))
		}
		h.pure("outer")
		requireIncrementalFold(t, h.finish().events())
	})
	t.Run("agent_in_loop", func(t *testing.T) {
		t.Parallel()
		wf := `{"name":"agents","nodes":[{"id":"start","type":"trigger"},
			{"id":"each","type":"loop","data":{"over":"{{input.qs}}","body":{"name":"b","nodes":[
				{"id":"start","type":"trigger"},
				{"id":"ask","type":"agent","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"Find {{input.item}}",
				 "tools":[{"name":"lookup","description":"look it up","parameters":{"type":"object"}}],"maxTurns":4}}],
				"edges":[{"from":"start","to":"ask"}]}}}],
			"edges":[{"from":"start","to":"each"}]}`
		h := newHistory(t, testRun, wf, `{"qs":["a","b","c"]}`).resume("w")
		for i := range 3 {
			ask := fmt.Sprintf("each[%d].ask", i)
			h.turn(ask+".turn[0]", provider2{"lookup", fmt.Sprintf(`{"q":%d}`, i)})
			h.start(ask+".turn[0].tool[0]").complete(ask+".turn[0].tool[0]", `{"hits":1}`, nil)
			h.turn(ask + ".turn[1]").pure(ask)
		}
		h.pure("each")
		requireIncrementalFold(t, h.finish().events())
	})
}

// TestLoopMemoForgetsAChangedIteration: an event naming a step of a
// finished iteration (here a failure journaled late) is seen by Next
// through the memo, as a fold from scratch sees it.
func TestLoopMemoForgetsAChangedIteration(t *testing.T) {
	t.Parallel()
	in := `{"urls":["a","b","c","d"],"tag":"t"}`
	h := newHistory(t, testRun, wfLoop, in).resume("w")
	for i := range 3 {
		f, s := fmt.Sprintf("each[%d].fetch", i), fmt.Sprintf("each[%d].sum", i)
		h.start(f).complete(f, `{"n":1}`, nil).start(s).complete(s, `{"got":1}`, nil)
	}
	h.plan("each[3].fetch") // Next has memoized iterations 0..2
	h.append(event.StepFailed, "each[1].sum", 1, event.StepFailedData{Error: "late", Class: event.ClassTool})
	f, ok := engine.Next(h.st.Workflow, h.st, h.now).(engine.Fail)
	require.True(t, ok, "Next must see the failure in iteration 1")
	require.Equal(t, "each[1].sum", f.StepID)
	requireIncrementalFold(t, h.events())
}
