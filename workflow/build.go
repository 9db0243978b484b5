package workflow

import (
	"encoding/json"
	"fmt"
)

// NodeData is the data of one node type: AIStepData, AgentData,
// ToolData, ConnectorData, ConditionData, ApprovalData, WaitData,
// LoopData, SubagentData or ProcessData. Its Go type names the node's
// type, so a node built from it (NewNode) cannot say one type and hold
// another's data.
type NodeData interface {
	// NodeType is the type of the node the data belongs to (TypeAIStep, …).
	NodeType() string
}

// NodeType implements NodeData.
func (AIStepData) NodeType() string { return TypeAIStep }

// NodeType implements NodeData.
func (AgentData) NodeType() string { return TypeAgent }

// NodeType implements NodeData.
func (ToolData) NodeType() string { return TypeTool }

// NodeType implements NodeData.
func (ConnectorData) NodeType() string { return TypeConnector }

// NodeType implements NodeData.
func (ConditionData) NodeType() string { return TypeCondition }

// NodeType implements NodeData.
func (ApprovalData) NodeType() string { return TypeApproval }

// NodeType implements NodeData.
func (WaitData) NodeType() string { return TypeWait }

// NodeType implements NodeData.
func (LoopData) NodeType() string { return TypeLoop }

// NodeType implements NodeData.
func (SubagentData) NodeType() string { return TypeSubagent }

// NodeType implements NodeData.
func (ProcessData) NodeType() string { return TypeProcess }

// NewNode is the node id holding d, of d's node type. It fails only when
// d holds raw JSON that is not JSON.
func NewNode(id string, d NodeData) (Node, error) {
	raw, err := json.Marshal(d)
	if err != nil {
		return Node{}, fmt.Errorf("node %q: encoding its data: %w", id, err)
	}
	return Node{ID: id, Type: d.NodeType(), Data: raw}, nil
}

// TriggerNode is the trigger node id: where a run starts, with no data.
func TriggerNode(id string) Node { return Node{ID: id, Type: TypeTrigger} }

// Build makes a workflow in code from its name, nodes and edges. It is
// held to everything Parse checks, and parsed from the document it
// encodes: that document is its Raw, what a run journals, so a workflow
// built in code reads back the same from the journal.
func Build(name string, nodes []Node, edges []Edge) (*Workflow, error) {
	raw, err := json.Marshal(&Workflow{Name: name, Nodes: nodes, Edges: edges})
	if err != nil {
		return nil, fmt.Errorf("workflow %q: encoding it: %w", name, err)
	}
	return Parse(raw)
}
