package engine_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/workflow"
)

func TestStepIDConstructors(t *testing.T) {
	t.Parallel()
	each := engine.NodeStep("each")
	fetch := each.InIteration(3, "fetch")
	ask := engine.NodeStep("outer").InIteration(0, "inner").InIteration(2, "ask")
	tests := []struct {
		id   engine.StepID
		want string
	}{
		{engine.NodeStep("fetch"), "fetch"},
		{fetch, "each[3].fetch"},
		{engine.NodeStep("outer").InIteration(0, "inner").InIteration(12, "ok"), "outer[0].inner[12].ok"},
		{engine.NodeStep("ask").AgentTurn(2), "ask.turn[2]"},
		{engine.NodeStep("ask").AgentTurn(2).ToolCall(0), "ask.turn[2].tool[0]"},
		{ask.AgentTurn(1).ToolCall(4), "outer[0].inner[2].ask.turn[1].tool[4]"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, tt.id.String())
		got, err := engine.ParseStepID(tt.want)
		require.NoError(t, err, tt.want)
		require.Equal(t, tt.id, got, "ParseStepID(%q) gives the parts it was made of", tt.want)
	}

	// Sibling iterations of one loop do not share their scope.
	a, b := each.InIteration(0, "x"), each.InIteration(1, "x")
	deeper := a.InIteration(5, "y")
	require.Equal(t, "each[0].x", a.String())
	require.Equal(t, "each[1].x", b.String())
	require.Equal(t, "each[0].x[5].y", deeper.String())
}

func TestParseStepID(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 64)
	nested := strings.Repeat("l[1].", 500) + "n"
	tests := []struct {
		in   string
		want *engine.StepID // nil: an error
	}{
		{"ok", &engine.StepID{Node: "ok"}},
		{"Node_2-b", &engine.StepID{Node: "Node_2-b"}},
		{long, &engine.StepID{Node: long}},
		{"each[0].fetch", &engine.StepID{Loops: []engine.Iteration{{Loop: "each", Index: 0}}, Node: "fetch"}},
		{"each[2147483647].x", &engine.StepID{Loops: []engine.Iteration{{Loop: "each", Index: engine.MaxStepIndex}}, Node: "x"}},
		{"ask.turn[0]", &engine.StepID{Node: "ask", Kind: engine.StepOfTurn}},
		{"ask.turn[3].tool[7]", &engine.StepID{Node: "ask", Kind: engine.StepOfToolCall, Turn: 3, Call: 7}},
		{"e[1].ask.turn[0].tool[0]", &engine.StepID{Loops: []engine.Iteration{{Loop: "e", Index: 1}}, Node: "ask", Kind: engine.StepOfToolCall}},
		// Nodes may be called turn or tool: only the segment after an
		// unindexed node is an agent's.
		{"turn", &engine.StepID{Node: "turn"}},
		{"turn[0].tool", &engine.StepID{Loops: []engine.Iteration{{Loop: "turn", Index: 0}}, Node: "tool"}},
		{"turn.turn[1]", &engine.StepID{Node: "turn", Kind: engine.StepOfTurn, Turn: 1}},

		// Hostile or malformed.
		{"", nil},
		{".", nil},
		{"a.", nil},
		{".a", nil},
		{"a..b", nil},
		{strings.Repeat("a", 65), nil},
		{"a b", nil},
		{"ü", nil},
		{"a\x00", nil},
		{"each[", nil},
		{"each[1", nil},
		{"each]1[.x", nil},
		{"each[1]]", nil},
		{"each[[1]].x", nil},
		{"each[1][2].x", nil},
		{"each[].x", nil},
		{"each[-1].x", nil},
		{"each[+1].x", nil},
		{"each[01].x", nil},
		{"each[1e3].x", nil},
		{"each[ 1].x", nil},
		{"each[0x10].x", nil},
		{"each[2147483648].x", nil},
		{"each[99999999999999999999999999].x", nil},
		{"each[3]", nil}, // an iteration, not a step
		{"each[3].", nil},
		{"[3].x", nil},
		{"ask.turn", nil},
		{"ask.turn[]", nil},
		{"ask.turn[1].tool", nil},
		{"ask.turn[1].tool[2].more", nil},
		{"ask.turn[1].call[2]", nil},
		{"ask.other", nil},
		{"ask.turn[1].turn[2]", nil},
		{"ask.turn[1].tool[2].tool[3]", nil},
		{"ask.turn[1].x[2].y", nil},
		{nested, nil}, // parses: see below
	}
	for _, tt := range tests {
		got, err := engine.ParseStepID(tt.in)
		if tt.in == nested {
			require.NoError(t, err)
			require.Len(t, got.Loops, 500)
			require.Equal(t, nested, got.String())
			continue
		}
		if tt.want == nil {
			require.ErrorIs(t, err, engine.ErrStepID, "%q parses as %#v", tt.in, got)
			require.Less(t, len(err.Error()), 400, "the error quotes a long id only in part")
			continue
		}
		require.NoError(t, err, tt.in)
		require.Equal(t, *tt.want, got, tt.in)
		require.Equal(t, tt.in, got.String(), "the id round-trips")
	}
}

func FuzzParseStepID(f *testing.F) {
	for _, s := range []string{"ok", "each[3].fetch", "ask.turn[2].tool[0]", "a[1].b[2].c.turn[0]", "x[", "x[0]]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := engine.ParseStepID(s)
		if err != nil {
			return
		}
		// Whatever parses is canonical: it prints back to itself.
		require.Equal(t, s, id.String())
	})
}

func TestNodeForStep(t *testing.T) {
	t.Parallel()
	wf, err := workflow.Parse([]byte(`{"name":"n","nodes":[{"id":"start","type":"trigger"},
	  {"id":"ok","type":"approval"},
	  {"id":"outer","type":"loop","data":{"over":"{{input.a}}","body":{"name":"b","nodes":[{"id":"start","type":"trigger"},
	    {"id":"inner","type":"loop","data":{"over":"{{input.b}}","body":{"name":"c","nodes":[{"id":"start","type":"trigger"},
	      {"id":"gate","type":"approval"}],"edges":[{"from":"start","to":"gate"}]}}}],
	    "edges":[{"from":"start","to":"inner"}]}}},
	  {"id":"ask","type":"agent","data":{"provider":"openai","model":"m","prompt":"p"}}],
	  "edges":[{"from":"start","to":"ok"},{"from":"ok","to":"outer"},{"from":"outer","to":"ask"}]}`))
	require.NoError(t, err)
	tests := []struct {
		id   string
		want string // the node's id; "" for none
	}{
		{"ok", "ok"},
		{"outer", "outer"},
		{"outer[0].inner", "inner"},
		{"outer[0].inner[2].gate", "gate"},
		{"ask", "ask"},
		{"ask.turn[0]", ""},         // turns have no node of their own
		{"ask.turn[0].tool[1]", ""}, // nor tool calls
		{"ok[0].x", ""},             // ok is no loop
		{"outer[0].gate", ""},       // gate is in inner's body
		{"outer[0]", ""},
		{"nope", ""},
		{"outer[0].inner[x].gate", ""},
		{"", ""},
	}
	for _, tt := range tests {
		n, ok := engine.NodeForStep(wf, tt.id)
		if tt.want == "" {
			require.False(t, ok, tt.id)
			continue
		}
		require.True(t, ok, tt.id)
		require.Equal(t, tt.want, n.ID, tt.id)
	}
	_, ok := engine.NodeForStep(nil, "ok")
	require.False(t, ok, "no workflow, no node")
}
