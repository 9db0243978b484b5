package workflow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
)

// The workflow's name is the exported field Name: Go does not allow a
// method of the same name.

// Raw returns the workflow document as given to Parse, compacted (object
// keys keep their order). It is what run_created stores as the snapshot.
// The caller must not modify it.
func (w *Workflow) Raw() json.RawMessage { return w.raw }

// Hash returns the hex sha256 of Raw: run_created's workflow_hash.
func (w *Workflow) Hash() string { return w.hash }

// Node returns the node with id id. The caller must not modify it.
func (w *Workflow) Node(id string) (*Node, bool) {
	i, ok := w.byID[id]
	if !ok {
		return nil, false
	}
	return &w.Nodes[i], true
}

// Trigger returns the trigger node; every parsed workflow has exactly one.
func (w *Workflow) Trigger() *Node {
	for i := range w.Nodes {
		if w.Nodes[i].Type == TypeTrigger {
			return &w.Nodes[i]
		}
	}
	return nil
}

// Order returns the node ids in topological order: every node comes after
// all the nodes with an edge into it; among nodes that could come next, the
// one declared first does. The trigger is first.
func (w *Workflow) Order() []string { return slices.Clone(w.order) }

// Incoming returns the edges into node id, in declaration order.
func (w *Workflow) Incoming(id string) []Edge { return w.edges(w.incoming[id]) }

// Outgoing returns the edges out of node id, in declaration order.
func (w *Workflow) Outgoing(id string) []Edge { return w.edges(w.outgoing[id]) }

func (w *Workflow) edges(idx []int) []Edge {
	if len(idx) == 0 {
		return nil
	}
	out := make([]Edge, len(idx))
	for i, ei := range idx {
		out[i] = w.Edges[ei]
	}
	return out
}

// WrongTypeError is returned by a typed accessor called on a node of
// another type.
type WrongTypeError struct {
	NodeID string
	Type   string // the node's type
	Want   string // the accessor's type
}

func (e *WrongTypeError) Error() string {
	return fmt.Sprintf("node %q is of type %q, not %q", e.NodeID, e.Type, e.Want)
}

func (n *Node) decode(want string, v any) error {
	if n.Type != want {
		return &WrongTypeError{NodeID: n.ID, Type: n.Type, Want: want}
	}
	if len(bytes.TrimSpace(n.Data)) == 0 {
		if want == TypeApproval {
			return nil // an approval's settings are all optional
		}
		return fmt.Errorf("node %q has no data", n.ID)
	}
	if err := json.Unmarshal(n.Data, v); err != nil {
		return fmt.Errorf("node %q: decoding %s data: %w", n.ID, want, err)
	}
	return nil
}

// AIStep decodes the data of an ai-step node. It returns a *WrongTypeError
// for a node of another type.
func (n *Node) AIStep() (*AIStepData, error) {
	var d AIStepData
	if err := n.decode(TypeAIStep, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Tool decodes the data of a tool node. It returns a *WrongTypeError for a
// node of another type.
func (n *Node) Tool() (*ToolData, error) {
	var d ToolData
	if err := n.decode(TypeTool, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Connector decodes the data of a connector node. It returns a
// *WrongTypeError for a node of another type.
func (n *Node) Connector() (*ConnectorData, error) {
	var d ConnectorData
	if err := n.decode(TypeConnector, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Condition decodes the data of a condition node. It returns a
// *WrongTypeError for a node of another type.
func (n *Node) Condition() (*ConditionData, error) {
	var d ConditionData
	if err := n.decode(TypeCondition, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Retry returns the node's data.retry, or nil when it has none (whatever
// the node's type). Attempts, Retries and Backoff work on a nil policy.
func (n *Node) Retry() *RetryPolicy {
	var d struct {
		Retry *RetryPolicy `json:"retry"`
	}
	if len(n.Data) == 0 || json.Unmarshal(n.Data, &d) != nil {
		return nil
	}
	return d.Retry
}

// OrderIndexes is OrderShared as positions in Nodes, for hot paths: the
// caller must not modify the slice.
func (w *Workflow) OrderIndexes() []int { return w.orderIdx }

// IncomingAt gives the incoming edges of the node at position i of Nodes
// (IncomingShared's) and, in the same order, their sources' positions,
// for hot paths: the caller must not modify the slices.
func (w *Workflow) IncomingAt(i int) ([]Edge, []int) { return w.inAt[i], w.inFrom[i] }

// Index returns the position of node id in Nodes, or -1.
func (w *Workflow) Index(id string) int {
	if i, ok := w.byID[id]; ok {
		return i
	}
	return -1
}
