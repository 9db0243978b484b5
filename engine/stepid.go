package engine

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/palrun/pal/workflow"
)

// StepKind says what a step id names.
type StepKind uint8

// Step kinds. The zero value is a node's step.
const (
	// StepOfNode is the step of a node: "fetch", "each[3].fetch".
	StepOfNode StepKind = iota
	// StepOfTurn is one model turn of an agent node: "ask.turn[2]".
	StepOfTurn
	// StepOfToolCall is one tool call of an agent's turn: "ask.turn[2].tool[0]".
	StepOfToolCall
)

// MaxStepIndex bounds the indices of a step id (loop iteration, turn, tool
// call): far above the workflow limits (10000 iterations, 1000 turns), low
// enough that a hostile id cannot overflow anything.
const MaxStepIndex = 1<<31 - 1

// Iteration is one iteration of a loop node in a step id: Loop[Index].
type Iteration struct {
	Loop  string
	Index int
}

// StepID is a step id in parts. Its String form is the journal's step_id:
// the node id, after the loop iterations it is in (each[3].fetch,
// outer[0].inner[2].fetch), and for an agent's model turns and tool calls
// the turn and the call (ask.turn[2], ask.turn[2].tool[0]). Ids stay the
// same across replays, so a completed step is found again by its id.
type StepID struct {
	// Loops are the loop iterations the step runs in, outermost first.
	Loops []Iteration
	// Node is the node the step belongs to; for turns and tool calls, the
	// agent node.
	Node string
	Kind StepKind
	// Turn is the agent turn (StepOfTurn, StepOfToolCall).
	Turn int
	// Call is the tool call within Turn (StepOfToolCall).
	Call int
}

// NodeStep is the id of node's step at the top level of a run.
func NodeStep(node string) StepID { return StepID{Node: node} }

// InIteration is the id of node's step in iteration i of the loop step
// id: each[3].fetch for NodeStep("each").InIteration(3, "fetch").
func (id StepID) InIteration(i int, node string) StepID {
	return StepID{Loops: id.iteration(i), Node: node}
}

// iteration is the scope of iteration i of the loop step id: its loops
// and then id's node at i. It never shares id.Loops' backing array, so
// sibling scopes do not overwrite each other.
func (id StepID) iteration(i int) []Iteration {
	loops := make([]Iteration, len(id.Loops), len(id.Loops)+1)
	copy(loops, id.Loops)
	return append(loops, Iteration{Loop: id.Node, Index: i})
}

// AgentTurn is the id of model turn k of the agent step id: ask.turn[k].
func (id StepID) AgentTurn(k int) StepID {
	return StepID{Loops: id.Loops, Node: id.Node, Kind: StepOfTurn, Turn: k}
}

// ToolCall is the id of tool call j of the turn id: ask.turn[2].tool[j].
func (id StepID) ToolCall(j int) StepID {
	return StepID{Loops: id.Loops, Node: id.Node, Kind: StepOfToolCall, Turn: id.Turn, Call: j}
}

// String returns the journal form of the id.
func (id StepID) String() string {
	if len(id.Loops) == 0 && id.Kind == StepOfNode {
		return id.Node
	}
	var buf [96]byte
	return string(id.appendTo(buf[:0]))
}

// appendTo appends the journal form of the id to b.
func (id StepID) appendTo(b []byte) []byte {
	for _, it := range id.Loops {
		b = append(b, it.Loop...)
		b = append(b, '[')
		b = strconv.AppendInt(b, int64(it.Index), 10)
		b = append(b, "]."...)
	}
	b = append(b, id.Node...)
	if id.Kind != StepOfNode {
		b = append(b, ".turn["...)
		b = strconv.AppendInt(b, int64(id.Turn), 10)
		b = append(b, ']')
	}
	if id.Kind == StepOfToolCall {
		b = append(b, ".tool["...)
		b = strconv.AppendInt(b, int64(id.Call), 10)
		b = append(b, ']')
	}
	return b
}

// ErrStepID is wrapped by ParseStepID's errors.
var ErrStepID = errors.New("malformed step id")

// ParseStepID splits a journal step id into its parts. It accepts exactly
// the ids String writes: node ids as a workflow allows them (letters,
// digits, '_' and '-', at most 64), indices in decimal without sign or
// leading zeros up to MaxStepIndex, "turn[k]" only after a node and
// "tool[j]" only after a turn. Errors wrap ErrStepID.
func ParseStepID(s string) (StepID, error) {
	bad := func(why string) (StepID, error) {
		return StepID{}, fmt.Errorf("%w %q: %s", ErrStepID, truncate(s, 80), why)
	}
	if s == "" {
		return bad("empty")
	}
	var id StepID
	rest := s
	for {
		seg, tail, more := strings.Cut(rest, ".")
		name, idx, indexed, err := splitSegment(seg)
		if err != nil {
			return bad(err.Error())
		}
		if !indexed {
			id.Node = name
			if !more {
				return id, nil
			}
			return parseAgentPart(id, tail, bad)
		}
		if !more {
			return bad(fmt.Sprintf("%s[%d] is a loop iteration, not a step: a node id must follow", name, idx))
		}
		id.Loops = append(id.Loops, Iteration{Loop: name, Index: idx})
		rest = tail
	}
}

// parseAgentPart parses what follows an agent node: turn[k] and maybe
// .tool[j].
func parseAgentPart(id StepID, s string, bad func(string) (StepID, error)) (StepID, error) {
	seg, tail, more := strings.Cut(s, ".")
	name, k, indexed, err := splitSegment(seg)
	if err != nil {
		return bad(err.Error())
	}
	if name != "turn" || !indexed {
		return bad(fmt.Sprintf("%q after node %s: want turn[<n>] (or a loop index on the node)", seg, id.Node))
	}
	id.Kind, id.Turn = StepOfTurn, k
	if !more {
		return id, nil
	}
	seg, tail, more = strings.Cut(tail, ".")
	name, j, indexed, err := splitSegment(seg)
	if err != nil {
		return bad(err.Error())
	}
	if name != "tool" || !indexed {
		return bad(fmt.Sprintf("%q after turn[%d]: want tool[<n>]", seg, k))
	}
	if more {
		return bad(fmt.Sprintf("%q after tool[%d]: a tool call has no steps inside", tail, j))
	}
	id.Kind, id.Call = StepOfToolCall, j
	return id, nil
}

// splitSegment splits "name" or "name[n]".
func splitSegment(seg string) (name string, idx int, indexed bool, err error) {
	name, tail, indexed := strings.Cut(seg, "[")
	if err := checkNodeID(name); err != nil {
		return "", 0, false, err
	}
	if !indexed {
		return name, 0, false, nil
	}
	num, ok := strings.CutSuffix(tail, "]")
	if !ok {
		return "", 0, false, fmt.Errorf("%q: unbalanced '['", seg)
	}
	if idx, err = parseIndex(num); err != nil {
		return "", 0, false, fmt.Errorf("%q: %v", seg, err)
	}
	return name, idx, true, nil
}

func checkNodeID(s string) error {
	if s == "" {
		return errors.New("empty node id")
	}
	if len(s) > 64 {
		return fmt.Errorf("node id %q... is longer than 64", s[:16])
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("node id %q: %q is not a letter, digit, '_' or '-'", truncate(s, 64), c)
		}
	}
	return nil
}

func parseIndex(s string) (int, error) {
	switch {
	case s == "":
		return 0, errors.New("empty index")
	case len(s) > 1 && s[0] == '0':
		return 0, errors.New("index with a leading zero")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errors.New("index is not a decimal number")
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > MaxStepIndex {
		return 0, fmt.Errorf("index over %d", MaxStepIndex)
	}
	return int(n), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// NodeForStep finds the node a step id belongs to: "ok", or a node inside
// loop iterations ("each[2].ok", "outer[0].inner[3].ok"). Agent turns and
// tool calls have no node of their own, and ids that do not parse or name
// no node of wf give false.
func NodeForStep(wf *workflow.Workflow, stepID string) (*workflow.Node, bool) {
	id, err := ParseStepID(stepID)
	if err != nil || id.Kind != StepOfNode || wf == nil {
		return nil, false
	}
	cur := wf
	for _, it := range id.Loops {
		n, ok := cur.Node(it.Loop)
		if !ok || n.Type != workflow.TypeLoop {
			return nil, false
		}
		if cur, ok = cur.Sub(it.Loop); !ok {
			return nil, false
		}
	}
	return cur.Node(id.Node)
}
