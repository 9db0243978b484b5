package workflow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
)

// Fake is an ai-step's or agent's fake block (data.fake): what pal dev's
// built-in fake provider (provider/providertest) answers the node's model
// calls, for demos and tests. A real provider never sees it: a worker
// sends it, as the X-Pal-Fake header, only with PAL_DEV_FAKE=1 and to a
// provider on loopback (docs/architecture.md §9.7). It is part of the node,
// so the journal holds it in the workflow of run_created; it is not part
// of a step's input, and changes no step's input, key or outcome on a
// real provider.
type Fake struct {
	// Turns script the answers: turn i answers an agent's turn i (an
	// ai-step's call is turn 0). Past the last, the fake answers as it
	// does without a script.
	Turns []FakeTurn `json:"turns,omitempty"`
	// Fail makes the first Times requests of the node's step (an agent's
	// turns counted together) answer with an HTTP error.
	Fail *FakeFail `json:"fail,omitempty"`
}

// FakeTurn is one scripted answer: tool calls, text, or a JSON value
// (sent as its compact text), text or json beside tool calls allowed.
type FakeTurn struct {
	Text      string          `json:"text,omitempty"`
	JSON      json.RawMessage `json:"json,omitempty"`
	ToolCalls []FakeToolCall  `json:"toolCalls,omitempty"`
}

// AnswerText is the turn's text: Text, or JSON compacted.
func (t FakeTurn) AnswerText() string {
	if len(t.JSON) == 0 {
		return t.Text
	}
	var b bytes.Buffer
	if json.Compact(&b, t.JSON) != nil {
		return string(t.JSON)
	}
	return b.String()
}

// FakeToolCall is a scripted call of the tool Name with Arguments (a JSON
// object; {} when left out).
type FakeToolCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// FakeFail is a scripted failure: the first Times requests answer Status.
type FakeFail struct {
	Status int `json:"status"`
	Times  int `json:"times"`
}

// Bounds of a fake block (the schema holds the same numbers).
const (
	// MaxFakeTurns bounds a script's turns.
	MaxFakeTurns = 32
	// MaxFakeToolCalls bounds one turn's tool calls.
	MaxFakeToolCalls = 16
	// MaxFakeBytes bounds the block as compact JSON: it travels in an
	// HTTP header.
	MaxFakeBytes = 8 << 10
	// MaxFakeFailTimes bounds fail.times.
	MaxFakeFailTimes = 10
)

// FakeOf returns the fake block of an ai-step or agent node, nil for
// others and for a node without one.
func FakeOf(n *Node) *Fake {
	switch n.Type {
	case TypeAIStep:
		if d, err := n.AIStep(); err == nil {
			return d.Fake
		}
	case TypeAgent:
		if d, err := n.Agent(); err == nil {
			return d.Fake
		}
	}
	return nil
}

// Header is the block as the X-Pal-Fake header carries it: compact JSON.
func (f *Fake) Header() (string, error) {
	b, err := json.Marshal(f)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// checkFake checks a node's fake block beyond the schema: its size, each
// turn's answer, and (tools the names of an agent's own tools, nil for an
// ai-step, which offers none) the tools its calls name. mcp: the agent
// offers MCP servers' tools too, whose names are known only when it runs.
func checkFake(n *Node, f *Fake, tools map[string]bool, mcp bool, ps *problems) {
	if f == nil {
		return
	}
	if h, err := f.Header(); err != nil {
		ps.node(n.ID, "data.fake", "%v", err)
		return
	} else if len(h) > MaxFakeBytes {
		ps.node(n.ID, "data.fake", "%d bytes as compact JSON, over %d (it travels in an HTTP header): script fewer or shorter turns", len(h), MaxFakeBytes)
	}
	for i, t := range f.Turns {
		field := fmt.Sprintf("data.fake.turns[%d]", i)
		if t.Text != "" && len(t.JSON) > 0 {
			ps.node(n.ID, field, "give text or json, not both")
		}
		if t.Text == "" && len(t.JSON) == 0 && len(t.ToolCalls) == 0 {
			ps.node(n.ID, field, "give toolCalls, text or json")
		}
		for j, tc := range t.ToolCalls {
			cf := fmt.Sprintf("%s.toolCalls[%d]", field, j)
			switch {
			case tools == nil:
				ps.node(n.ID, cf, "an ai-step offers no tools: script text or json, or make the node an agent")
			case !tools[tc.Name] && !mcp:
				ps.node(n.ID, cf+".name", "%q is not one of the agent's tools%s", tc.Name, suggest(tc.Name, keysOf(tools)))
			}
		}
	}
}

// keysOf lists a set's members, sorted.
func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
