package runs_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workflow"
)

// TestWaterfallOfNesting folds a hand-made journal of an agent with turns
// and tool calls, a loop and a step of a loop whose loop step is not in
// the journal (a row stands for it), and checks the tree, the open
// segments and the axis.
func TestWaterfallOfNesting(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	j := &timedJournal{t0: t0}
	add := j.add
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
	add(5, event.StepStarted, "ask.turn[0].tool[1]", 1, event.StepStartedData{NodeID: "ask", NodeType: "agent", IdempotencyKey: "k-tool",
		Input: json.RawMessage(`{"tool":"echo","input":{"n":1},"tool_call_id":"c1"}`)})
	done(6, "ask.turn[0].tool[1]")
	start(7, "ask.turn[1]", "ai-step")
	done(8, "ask.turn[1]")
	done(9, "ask")
	start(10, "each", "loop")
	start(11, "each[0].t", "tool")
	done(12, "each[0].t")
	start(13, "orphan[4].t", "tool")
	start(14, "each[1].t", "tool")
	st, err := engine.Fold(j.evs)
	require.NoError(t, err)

	w := runs.WaterfallOf(j.evs, st, t0.Add(20*time.Millisecond))
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
		{"orphan", "", 0, 1},
		{"orphan[4].t", "orphan", 1, 0},
	}, got)
	require.Equal(t, 20.0, w.SpanMs, "a run in flight: the axis ends now")
	require.Equal(t, []runs.Segment{{Outcome: "running", StartMs: 13, EndMs: 20, Open: true}}, w.Rows[7].Segments,
		"a loop not journaled yet is a row spanning its steps")
	require.Equal(t, "loop", w.Rows[7].NodeType)
	require.Equal(t, -1, w.Rows[7].Lane)
	last := w.Rows[6].Segments[0]
	require.Equal(t, runs.Segment{Attempt: 1, Tries: 1, Outcome: "running", StartMs: 14, EndMs: 20, Open: true}, last)
	require.Equal(t, runs.Segment{Attempt: 1, Tries: 1, Outcome: "completed", StartMs: 3, EndMs: 4}, w.Rows[1].Segments[0])
	require.Equal(t, []runs.Drive{{Seq: 2, AtMs: 1, Worker: "w1", Count: 1}}, w.Drives)
	require.Equal(t, "k-ask", w.Rows[0].Key)
	require.Equal(t, "echo", w.Rows[2].Tool, "a tool call is labelled by its tool")
	require.Equal(t, "agent", w.Rows[2].NodeType)
	require.Empty(t, w.Rows[0].Tool)
	require.Equal(t, engine.StepRunning, w.Rows[6].Status, "in flight while the run is")
}

// TestWaterfallInterrupted: a run cancelled while one step ran, one
// waited and one was in backoff draws those steps interrupted, their
// last bars ending at the run's end and not open; a step that ended
// keeps its status.
func TestWaterfallInterrupted(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	j := &timedJournal{t0: t0}
	add := j.add
	start := func(ms int, step string, attempt int) {
		add(ms, event.StepStarted, step, attempt, event.StepStartedData{NodeID: step, NodeType: "tool", IdempotencyKey: "k-" + step})
	}
	add(0, event.RunCreated, "", 0, event.RunCreatedData{Input: json.RawMessage(`{}`)})
	add(1, event.RunResumed, "", 0, event.RunResumedData{Worker: "w1", ResumeCount: 1})
	start(2, "done", 1)
	add(3, event.StepCompleted, "done", 1, event.StepCompletedData{Output: json.RawMessage(`{}`)})
	start(4, "run", 1)
	start(5, "wait", 1)
	add(6, event.StepWaiting, "wait", 1, event.StepWaitingData{Reason: "signal"})
	start(7, "retry", 1)
	add(8, event.StepRetrying, "retry", 1, event.StepRetryingData{Attempt: 2, Of: 3, Error: "no", Class: "tool", DelayMs: 1000})
	add(10, event.RunCancelled, "", 0, event.RunCancelledData{Reason: "enough"})
	st, err := engine.Fold(j.evs)
	require.NoError(t, err)

	w := runs.WaterfallOf(j.evs, st, t0.Add(time.Hour))
	require.Equal(t, 10.0, w.SpanMs, "the axis ends at the run's end")
	status := map[string]engine.StepStatus{}
	for _, r := range w.Rows {
		status[r.StepID] = r.Status
	}
	require.Equal(t, map[string]engine.StepStatus{"done": engine.StepCompleted, "run": runs.StepInterrupted,
		"wait": runs.StepInterrupted, "retry": runs.StepInterrupted}, status)
	require.Equal(t, runs.Segment{Attempt: 1, Tries: 1, Outcome: "interrupted", StartMs: 4, EndMs: 10}, w.Rows[1].Segments[0])
	wait := w.Rows[2]
	require.Equal(t, "interrupted", wait.Segments[0].Outcome)
	require.Equal(t, &runs.Wait{Reason: "signal", StartMs: 6, EndMs: 10}, wait.Segments[0].Wait)
	require.Empty(t, wait.WaitReason, "no longer waiting")
	require.Equal(t, []string{"retried"}, []string{w.Rows[3].Segments[0].Outcome}, "the retried attempt ended; the step is interrupted in backoff")

	// RunView says the same of the steps.
	v := runs.ViewOf(st)
	status = map[string]engine.StepStatus{}
	for _, s := range v.Steps {
		status[s.StepID] = s.Status
	}
	require.Equal(t, map[string]engine.StepStatus{"done": engine.StepCompleted, "run": runs.StepInterrupted,
		"wait": runs.StepInterrupted, "retry": runs.StepInterrupted}, status)
}

// TestWaterfallLanes: steps in flight at once are in lanes of their own,
// a step that starts once one ended takes its lane again, and the
// waterfall says how many lanes there are.
func TestWaterfallLanes(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	j := &timedJournal{t0: t0}
	add := func(ms int, k event.Kind, step string, data any) {
		attempt := 1
		if step == "" {
			attempt = 0
		}
		j.add(ms, k, step, attempt, data)
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
	st, err := engine.Fold(j.evs)
	require.NoError(t, err)
	w := runs.WaterfallOf(j.evs, st, t0.Add(20*time.Millisecond))
	lanes := map[string]int{}
	for _, r := range w.Rows {
		lanes[r.StepID] = r.Lane
	}
	require.Equal(t, map[string]int{"a": 0, "b": 1, "c": 2, "d": 1, "join": 0}, lanes)
	require.Equal(t, 3, w.Lanes, "three at once at most")
}

// TestWaterfallParentsSpan: as the engine journals them, a loop's and an
// agent's own steps come when they end. While they run, rows stand for
// them, above their nested steps and spanning them; once journaled, their
// bars start where their first nested step started; a run that failed
// mid-loop draws the loop interrupted.
func TestWaterfallParentsSpan(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	j := &timedJournal{t0: t0}
	add := func(ms int, k event.Kind, step string, data any) {
		attempt := 1
		if step == "" {
			attempt = 0
		}
		j.add(ms, k, step, attempt, data)
	}
	start := func(ms int, step, typ string) {
		add(ms, event.StepStarted, step, event.StepStartedData{NodeID: step, NodeType: typ, IdempotencyKey: "k-" + step})
	}
	done := func(ms int, step string) {
		add(ms, event.StepCompleted, step, event.StepCompletedData{Output: json.RawMessage(`{}`)})
	}
	add(0, event.RunCreated, "", event.RunCreatedData{Input: json.RawMessage(`{}`)})
	add(1, event.RunResumed, "", event.RunResumedData{Worker: "w1", ResumeCount: 1})
	start(2, "each[0].ask.turn[0]", "agent")
	start(3, "each[1].t", "tool")
	st, err := engine.Fold(j.evs)
	require.NoError(t, err)

	type row struct {
		ID, Type string
		Depth    int
		Status   engine.StepStatus
		Segs     []runs.Segment
	}
	rowsOf := func(w *runs.Waterfall) []row {
		var got []row
		for _, r := range w.Rows {
			got = append(got, row{r.StepID, r.NodeType, r.Depth, r.Status, r.Segments})
		}
		return got
	}
	w := runs.WaterfallOf(j.evs, st, t0.Add(10*time.Millisecond))
	require.Equal(t, []row{
		{"each", "loop", 0, "running", []runs.Segment{{Outcome: "running", StartMs: 2, EndMs: 10, Open: true}}},
		{"each[0].ask", "agent", 1, "running", []runs.Segment{{Outcome: "running", StartMs: 2, EndMs: 10, Open: true}}},
		{"each[0].ask.turn[0]", "agent", 2, "running", []runs.Segment{{Attempt: 1, Tries: 1, Outcome: "running", StartMs: 2, EndMs: 10, Open: true}}},
		{"each[1].t", "tool", 1, "running", []runs.Segment{{Attempt: 1, Tries: 1, Outcome: "running", StartMs: 3, EndMs: 10, Open: true}}},
	}, rowsOf(w), "rows stand for the loop and the agent while they run")

	// The run fails mid-loop: the loop and the agent are interrupted.
	failed := append([]event.Event(nil), j.evs...)
	ev := event.MustNew(event.RunFailed, "", 0, event.RunFailedData{Error: "no"})
	ev.RunID, ev.Seq, ev.TS = "r1", uint64(len(failed)+1), t0.Add(12*time.Millisecond)
	failed = append(failed, ev)
	fst, err := engine.Fold(failed)
	require.NoError(t, err)
	for _, r := range runs.WaterfallOf(failed, fst, t0.Add(time.Hour)).Rows {
		require.Equal(t, runs.StepInterrupted, r.Status, r.StepID)
		require.Equal(t, "interrupted", r.Segments[0].Outcome, r.StepID)
		require.Equal(t, 12.0, r.Segments[0].EndMs, r.StepID)
	}

	// Everything ends; the agent and the loop journal their steps last.
	done(5, "each[0].ask.turn[0]")
	start(6, "each[0].ask", "agent")
	done(6, "each[0].ask")
	done(7, "each[1].t")
	start(8, "each", "loop")
	done(8, "each")
	add(9, event.RunSucceeded, "", event.RunSucceededData{Output: json.RawMessage(`{}`)})
	st, err = engine.Fold(j.evs)
	require.NoError(t, err)
	w = runs.WaterfallOf(j.evs, st, t0.Add(time.Hour))
	require.Equal(t, []row{
		{"each", "loop", 0, "completed", []runs.Segment{{Attempt: 1, Tries: 1, Outcome: "completed", StartMs: 2, EndMs: 8}}},
		{"each[0].ask", "agent", 1, "completed", []runs.Segment{{Attempt: 1, Tries: 1, Outcome: "completed", StartMs: 2, EndMs: 6}}},
		{"each[0].ask.turn[0]", "agent", 2, "completed", []runs.Segment{{Attempt: 1, Tries: 1, Outcome: "completed", StartMs: 2, EndMs: 5}}},
		{"each[1].t", "tool", 1, "completed", []runs.Segment{{Attempt: 1, Tries: 1, Outcome: "completed", StartMs: 3, EndMs: 7}}},
	}, rowsOf(w), "a loop's and an agent's bars span their nested steps")
}

// TestWaterfallSubsteps: a process step's sub-steps are rows nested in
// its row, in the order they first started, one segment per attempt that
// ran them; one still open when the step was killed reads interrupted in
// that attempt, and completed once the next attempt finished it. The lane
// view leaves them out.
func TestWaterfallSubsteps(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	j := &timedJournal{t0: t0}
	add := j.add
	add(0, event.RunCreated, "", 0, event.RunCreatedData{Input: json.RawMessage(`{}`)})
	add(1, event.RunResumed, "", 0, event.RunResumedData{Worker: "w1", ResumeCount: 1})
	add(2, event.StepStarted, "agent", 1, event.StepStartedData{NodeID: "agent", NodeType: "process", IdempotencyKey: "k"})
	add(3, event.SubstepStarted, "agent", 1, event.SubstepStartedData{Name: "plan"})
	add(5, event.SubstepCompleted, "agent", 1, event.SubstepCompletedData{Name: "plan", Output: json.RawMessage(`1`)})
	add(6, event.SubstepStarted, "agent", 1, event.SubstepStartedData{Name: "search"})
	add(9, event.StepRetrying, "agent", 1, event.StepRetryingData{Attempt: 2, Of: 3, Error: "killed", Class: "tool", DelayMs: 1})
	add(10, event.StepStarted, "agent", 2, event.StepStartedData{NodeID: "agent", NodeType: "process", IdempotencyKey: "k2"})
	add(11, event.SubstepStarted, "agent", 2, event.SubstepStartedData{Name: "search"})
	add(14, event.SubstepCompleted, "agent", 2, event.SubstepCompletedData{Name: "search", Output: json.RawMessage(`2`)})
	add(15, event.SubstepStarted, "agent", 2, event.SubstepStartedData{Name: "write"})
	st, err := engine.Fold(j.evs)
	require.NoError(t, err)

	w := runs.WaterfallOf(j.evs, st, t0.Add(20*time.Millisecond))
	require.Len(t, w.Rows, 4)
	require.Equal(t, "agent", w.Rows[0].StepID)
	require.Equal(t, 3, w.Rows[0].Children)
	type row struct {
		id, parent string
		depth      int
		status     engine.StepStatus
		lane       int
		segs       []runs.Segment
	}
	var got []row
	for _, r := range w.Rows[1:] {
		require.Equal(t, runs.SubstepRow, r.NodeType)
		got = append(got, row{r.StepID, r.Parent, r.Depth, r.Status, r.Lane, r.Segments})
	}
	require.Equal(t, []row{
		{"agent/plan", "agent", 1, engine.StepCompleted, -1, []runs.Segment{{Attempt: 1, Tries: 1, Outcome: "completed", StartMs: 3, EndMs: 5}}},
		{"agent/search", "agent", 1, engine.StepCompleted, -1, []runs.Segment{
			{Attempt: 1, Tries: 1, Outcome: "interrupted", StartMs: 6, EndMs: 11},
			{Attempt: 2, Tries: 1, Outcome: "completed", StartMs: 11, EndMs: 14}}},
		{"agent/write", "agent", 1, engine.StepRunning, -1, []runs.Segment{{Attempt: 2, Tries: 1, Outcome: "running", StartMs: 15, EndMs: 20, Open: true}}},
	}, got)
	require.Equal(t, 1, w.Lanes, "the lane view has the process step alone")
}

// timedJournal builds run r1's journal, each event ms after t0, with its
// seq in order.
type timedJournal struct {
	t0  time.Time
	evs []event.Event
}

func (j *timedJournal) add(ms int, k event.Kind, step string, attempt int, data any) {
	ev := event.MustNew(k, step, attempt, data)
	ev.RunID, ev.Seq, ev.TS = "r1", uint64(len(j.evs)+1), j.t0.Add(time.Duration(ms)*time.Millisecond)
	j.evs = append(j.evs, ev)
}

// TestWaterfallGraph: the waterfall carries the run's workflow as a graph,
// its loop body's and its subagent's workflows included, each node with
// its outcome: a failed branch, a completed one, a node not reached, a
// loop body node running in its second iteration, the trigger fired.
func TestWaterfallGraph(t *testing.T) {
	t.Parallel()
	wf := `{"name":"g","nodes":[{"id":"start","type":"trigger"},
	  {"id":"ok","type":"tool","data":{"tool":"echo"}},
	  {"id":"bad","type":"tool","data":{"tool":"echo"},"onFailure":"continue"},
	  {"id":"each","type":"loop","data":{"over":"{{input.items}}","body":{"name":"b","nodes":[{"id":"start","type":"trigger"},
	    {"id":"t","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"t"}]}}},
	  {"id":"sub","type":"subagent","data":{"workflow":{"name":"c","nodes":[{"id":"start","type":"trigger"},
	    {"id":"x","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"x"}]}}},
	  {"id":"later","type":"tool","data":{"tool":"echo"}}],
	  "edges":[{"from":"start","to":"ok"},{"from":"start","to":"bad"},{"from":"ok","to":"each"},{"from":"each","to":"sub"},
	    {"from":"sub","to":"later","condition":"true"}]}`
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	j := &timedJournal{t0: t0}
	start := func(ms int, step, node, typ string) {
		j.add(ms, event.StepStarted, step, 1, event.StepStartedData{NodeID: node, NodeType: typ, IdempotencyKey: "k-" + step})
	}
	j.add(0, event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(wf), WorkflowName: "g", Input: json.RawMessage(`{"items":[1,2]}`)})
	start(1, "ok", "ok", "tool")
	j.add(2, event.StepCompleted, "ok", 1, event.StepCompletedData{Output: json.RawMessage(`{}`)})
	start(3, "bad", "bad", "tool")
	j.add(4, event.StepFailed, "bad", 1, event.StepFailedData{Error: "no", Class: "tool"})
	start(5, "each[0].t", "t", "tool")
	j.add(6, event.StepCompleted, "each[0].t", 1, event.StepCompletedData{Output: json.RawMessage(`{}`)})
	start(7, "each[1].t", "t", "tool")
	st, err := engine.Fold(j.evs)
	require.NoError(t, err)
	require.NotNil(t, st.Workflow, "%v", st.WorkflowErr)

	g := runs.WaterfallOf(j.evs, st, t0.Add(time.Second)).Graph
	require.NotNil(t, g)
	status := map[string]string{}
	for _, n := range g.Nodes {
		status[n.ID] = n.Status
	}
	require.Equal(t, map[string]string{"start": "completed", "ok": "completed", "bad": "failed", "each": "running", "sub": "not_reached",
		"later": "not_reached", "each/start": "completed", "each/t": "running", "sub/start": "child", "sub/x": "child"}, status)
	byID := map[string]runs.GraphNode{}
	for _, n := range g.Nodes {
		byID[n.ID] = n
	}
	require.Equal(t, runs.GraphNode{ID: "each/t", Node: "t", Type: "tool", Parent: "each", Status: "running", StepID: "each[1].t", Steps: 2}, byID["each/t"])
	require.Equal(t, "bad", byID["bad"].StepID)
	require.Equal(t, []runs.GraphEdge{{From: "start", To: "ok"}, {From: "start", To: "bad"}, {From: "ok", To: "each"}, {From: "each", To: "sub"},
		{From: "sub", To: "later", Condition: "true"}, {From: "each/start", To: "each/t"}, {From: "each", To: "each/start", Contains: true},
		{From: "sub/start", To: "sub/x"}, {From: "sub", To: "sub/start", Contains: true}}, g.Edges)
	require.False(t, g.Truncated)

	// A plain LLM run has no graph.
	require.Nil(t, runs.GraphOf(nil, nil))
}

// TestWaterfallGraphBound: a workflow whose loop bodies hold more nodes
// than MaxGraphNodes in all is cut, outer workflow first, and says so.
func TestWaterfallGraphBound(t *testing.T) {
	t.Parallel()
	body := func() string {
		nodes := []string{`{"id":"start","type":"trigger"}`}
		edges := []string{}
		prev := "start"
		for i := range 999 {
			id := fmt.Sprintf("n%d", i)
			nodes = append(nodes, fmt.Sprintf(`{"id":%q,"type":"tool","data":{"tool":"echo"}}`, id))
			edges = append(edges, fmt.Sprintf(`{"from":%q,"to":%q}`, prev, id))
			prev = id
		}
		return `{"name":"b","nodes":[` + strings.Join(nodes, ",") + `],"edges":[` + strings.Join(edges, ",") + `]}`
	}()
	var nodes, edges []string
	nodes = append(nodes, `{"id":"start","type":"trigger"}`)
	for i := range 6 {
		nodes = append(nodes, fmt.Sprintf(`{"id":"l%d","type":"loop","data":{"over":"{{input.items}}","body":%s}}`, i, body))
		edges = append(edges, fmt.Sprintf(`{"from":"start","to":"l%d"}`, i))
	}
	wf, err := workflow.Parse([]byte(`{"name":"big","nodes":[` + strings.Join(nodes, ",") + `],"edges":[` + strings.Join(edges, ",") + `]}`))
	require.NoError(t, err)
	g := runs.GraphOf(wf, nil)
	require.True(t, g.Truncated)
	require.LessOrEqual(t, len(g.Nodes), runs.MaxGraphNodes)
	require.Len(t, g.Nodes, 7+4*1000, "the outer workflow and the bodies that fit")
	require.Equal(t, "l3/n998", g.Nodes[len(g.Nodes)-1].ID)
}
