package runs_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
)

// TestWaterfallOfNesting folds a hand-made journal of an agent with turns
// and tool calls, a loop and a step of a loop whose loop step is not in
// the journal, and checks the tree, the open segments and the axis.
func TestWaterfallOfNesting(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var evs []event.Event
	add := func(ms int, k event.Kind, step string, attempt int, data any) {
		ev := event.MustNew(k, step, attempt, data)
		ev.RunID, ev.Seq, ev.TS = "r1", uint64(len(evs)+1), t0.Add(time.Duration(ms)*time.Millisecond)
		evs = append(evs, ev)
	}
	start := func(ms int, step, typ string) {
		add(ms, event.StepStarted, step, 1, event.StepStartedData{NodeID: step, NodeType: typ, IdempotencyKey: "k-" + step})
	}
	done := func(ms int, step string) {
		add(ms, event.StepCompleted, step, 1, event.StepCompletedData{Output: json.RawMessage(`{}`)})
	}
	add(0, event.RunCreated, "", 0, event.RunCreatedData{Input: json.RawMessage(`{}`)})
	add(1, event.RunResumed, "", 0, event.RunResumedData{Worker: "w1", ResumeCount: 1})
	start(2, "ask", "agent")
	start(3, "ask.turn[0]", "ai-step")
	done(4, "ask.turn[0]")
	start(5, "ask.turn[0].tool[1]", "tool")
	done(6, "ask.turn[0].tool[1]")
	start(7, "ask.turn[1]", "ai-step")
	done(8, "ask.turn[1]")
	done(9, "ask")
	start(10, "each", "loop")
	start(11, "each[0].t", "tool")
	done(12, "each[0].t")
	start(13, "orphan[4].t", "tool")
	start(14, "each[1].t", "tool")
	st, err := engine.Fold(evs)
	require.NoError(t, err)

	w := runs.WaterfallOf(evs, st, t0.Add(20*time.Millisecond))
	type row struct {
		ID, Parent string
		Depth, N   int
	}
	var got []row
	for _, r := range w.Rows {
		got = append(got, row{r.StepID, r.Parent, r.Depth, r.Children})
	}
	require.Equal(t, []row{
		{"ask", "", 0, 2},
		{"ask.turn[0]", "ask", 1, 1},
		{"ask.turn[0].tool[1]", "ask.turn[0]", 2, 0},
		{"ask.turn[1]", "ask", 1, 0},
		{"each", "", 0, 2},
		{"each[0].t", "each", 1, 0},
		{"each[1].t", "each", 1, 0},
		{"orphan[4].t", "", 0, 0},
	}, got)
	require.Equal(t, 20.0, w.SpanMs, "a run in flight: the axis ends now")
	last := w.Rows[6].Segments[0]
	require.Equal(t, runs.Segment{Attempt: 1, Tries: 1, Outcome: "running", StartMs: 14, EndMs: 20, Open: true}, last)
	require.Equal(t, runs.Segment{Attempt: 1, Tries: 1, Outcome: "completed", StartMs: 3, EndMs: 4}, w.Rows[1].Segments[0])
	require.Equal(t, []runs.Drive{{Seq: 2, AtMs: 1, Worker: "w1", Count: 1}}, w.Drives)
	require.Equal(t, "k-ask", w.Rows[0].Key)
}

// TestWaterfallLanes: steps in flight at once are in lanes of their own,
// a step that starts once one ended takes its lane again, and the
// waterfall says how many lanes there are.
func TestWaterfallLanes(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var evs []event.Event
	add := func(ms int, k event.Kind, step string, data any) {
		attempt := 1
		if step == "" {
			attempt = 0
		}
		ev := event.MustNew(k, step, attempt, data)
		ev.RunID, ev.Seq, ev.TS = "r1", uint64(len(evs)+1), t0.Add(time.Duration(ms)*time.Millisecond)
		evs = append(evs, ev)
	}
	start := func(ms int, step string) {
		add(ms, event.StepStarted, step, event.StepStartedData{NodeID: step, NodeType: "ai-step", IdempotencyKey: "k-" + step})
	}
	done := func(ms int, step string) {
		add(ms, event.StepCompleted, step, event.StepCompletedData{Output: json.RawMessage(`{}`)})
	}
	add(0, event.RunCreated, "", event.RunCreatedData{Input: json.RawMessage(`{}`)})
	add(1, event.RunResumed, "", event.RunResumedData{Worker: "w1", ResumeCount: 1})
	start(2, "a")
	start(2, "b")
	start(2, "c")
	done(10, "b")
	start(11, "d") // b's lane is free again
	done(12, "a")
	done(13, "c")
	done(14, "d")
	start(15, "join")
	st, err := engine.Fold(evs)
	require.NoError(t, err)
	w := runs.WaterfallOf(evs, st, t0.Add(20*time.Millisecond))
	lanes := map[string]int{}
	for _, r := range w.Rows {
		lanes[r.StepID] = r.Lane
	}
	require.Equal(t, map[string]int{"a": 0, "b": 1, "c": 2, "d": 1, "join": 0}, lanes)
	require.Equal(t, 3, w.Lanes, "three at once at most")
}
