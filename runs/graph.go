package runs

import (
	"strings"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/workflow"
)

// Graph is a run's workflow as the web UI's graph tab draws it: the nodes
// and edges of the snapshot run_created journaled, loop bodies and
// subagent workflows included, each node with its outcome in this run.
// The browser lays it out; it does not fold.
type Graph struct {
	Nodes []GraphNode `json:"nodes"`
	Edges []GraphEdge `json:"edges"`
	// Truncated reports that the workflow had more than MaxGraphNodes
	// nodes or MaxGraphEdges edges, nested ones included: the graph holds
	// the first ones (outer workflows first).
	Truncated bool `json:"truncated,omitempty"`
}

// GraphNode is one node of a Graph.
type GraphNode struct {
	// ID is unique in the graph: the node's id, after the ids of the
	// nodes holding it (each/fetch: node fetch of loop each's body).
	ID   string `json:"id"`
	Node string `json:"node"`
	Type string `json:"type"`
	// Parent is the graph id of the loop or subagent node whose workflow
	// holds this one; "" at the top level.
	Parent string `json:"parent,omitempty"`
	// Status is the node's outcome in this run, by the waterfall's names
	// (completed, failed, running, waiting, retrying, interrupted), or
	// not_reached (GraphNotReached) for a node no step ran, or child
	// (GraphInChildRun) for a node of a subagent's workflow, whose steps
	// are the child run's. A node run once per loop iteration takes the
	// first of running, retrying, waiting, failed, interrupted and
	// completed that one of its steps has.
	Status string `json:"status"`
	// StepID is the waterfall row the node's detail shows: its step, or
	// the latest iteration's; "" when none ran. Steps counts its steps.
	StepID string `json:"step_id,omitempty"`
	Steps  int    `json:"steps,omitempty"`
}

// GraphEdge is one edge of a Graph, between graph ids. Contains marks
// the link from a loop or subagent node to the trigger of the workflow
// it holds, which is no edge of any workflow.
type GraphEdge struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Condition string `json:"condition,omitempty"`
	Contains  bool   `json:"contains,omitempty"`
}

// Graph node statuses besides the waterfall's step statuses.
const (
	GraphNotReached = "not_reached"
	GraphInChildRun = "child"
)

// Bounds on a Graph: a workflow document may hold up to 1,000 nodes and
// 10,000 edges per workflow, nested workflows each as many again.
const (
	MaxGraphNodes = 5000
	MaxGraphEdges = 20000
)

// graphRank orders the statuses of a node's steps: the lowest rank wins.
var graphRank = map[string]int{
	string(engine.StepRunning): 0, string(engine.StepRetrying): 1, string(engine.StepWaiting): 2,
	string(engine.StepFailed): 3, string(StepInterrupted): 4, string(engine.StepCompleted): 5,
}

// GraphOf is the graph of wf with each node's outcome from the rows of
// the run's waterfall; nil for a run with no workflow (a plain LLM run).
func GraphOf(wf *workflow.Workflow, rows []WaterfallRow) *Graph {
	if wf == nil {
		return nil
	}
	// The rows of each node, by its graph id: a step's loops' nodes, then
	// its node (each[3].fetch → each/fetch). Turns, tool calls and
	// sub-steps belong to their node's own step.
	type ran struct {
		status string
		step   string
		n      int
	}
	byNode := map[string]*ran{}
	for _, r := range rows {
		sid, err := engine.ParseStepID(r.StepID)
		if err != nil || sid.Kind != engine.StepOfNode {
			continue
		}
		var b strings.Builder
		for _, l := range sid.Loops {
			b.WriteString(l.Loop)
			b.WriteByte('/')
		}
		b.WriteString(sid.Node)
		k := b.String()
		x := byNode[k]
		if x == nil {
			x = &ran{status: string(r.Status)}
			byNode[k] = x
		} else if rk, ok := graphRank[string(r.Status)]; ok && rk < graphRank[x.status] {
			x.status = string(r.Status)
		}
		x.step = r.StepID // rows keep journal order: the latest
		x.n++
	}

	g := &Graph{Nodes: []GraphNode{}, Edges: []GraphEdge{}}
	var add func(w *workflow.Workflow, prefix, parent string, child bool)
	add = func(w *workflow.Workflow, prefix, parent string, child bool) {
		if len(g.Nodes)+len(w.Nodes) > MaxGraphNodes || len(g.Edges)+len(w.Edges)+1 > MaxGraphEdges {
			g.Truncated = true
			return
		}
		var nested []*workflow.Node
		for i := range w.Nodes {
			n := &w.Nodes[i]
			gn := GraphNode{ID: prefix + n.ID, Node: n.ID, Type: n.Type, Parent: parent, Status: GraphNotReached}
			switch x := byNode[gn.ID]; {
			case child:
				gn.Status = GraphInChildRun
			case x != nil:
				gn.Status, gn.StepID, gn.Steps = x.status, x.step, x.n
			case n.Type == workflow.TypeTrigger && (parent == "" || byNode[parent] != nil):
				// A trigger journals no step: it fired when its
				// workflow (or its loop) started.
				gn.Status = string(engine.StepCompleted)
			}
			g.Nodes = append(g.Nodes, gn)
			if _, ok := w.Sub(n.ID); ok {
				nested = append(nested, n)
			}
		}
		for _, e := range w.Edges {
			g.Edges = append(g.Edges, GraphEdge{From: prefix + e.From, To: prefix + e.To, Condition: e.Condition})
		}
		// Nested workflows after this one's nodes, so a truncated
		// graph keeps the outer ones whole.
		for _, n := range nested {
			sub, _ := w.Sub(n.ID)
			id := prefix + n.ID
			before := len(g.Nodes)
			add(sub, id+"/", id, child || n.Type == workflow.TypeSubagent)
			if len(g.Nodes) > before {
				if t := sub.Trigger(); t != nil {
					g.Edges = append(g.Edges, GraphEdge{From: id, To: id + "/" + t.ID, Contains: true})
				}
			}
		}
	}
	add(wf, "", "", false)
	return g
}
