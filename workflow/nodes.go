package workflow

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ApprovalData is the data of an approval node: the run parks until
// someone approves or rejects.
type ApprovalData struct {
	// Prompt tells the approver what is asked (a template).
	Prompt string `json:"prompt,omitempty"`
	// Approvers, when set, lists who may decide.
	Approvers []string `json:"approvers,omitempty"`
	// TimeoutMs, when set, ends the wait: the step completes with
	// {"decision":"timeout","timed_out":true}.
	TimeoutMs int `json:"timeoutMs,omitempty"`
}

// WaitData is the data of a wait node: the run parks until a signal of
// that name arrives (runs.Client.Signal). Signals sent before the run
// reaches the node are kept, first in first out per name; the node takes
// the oldest one not yet taken. Its output is the signal's payload.
type WaitData struct {
	Signal string `json:"signal"`
	// TimeoutMs, when set, ends the wait: the step completes with
	// {"signal":name,"timed_out":true}.
	TimeoutMs int `json:"timeoutMs,omitempty"`
}

// MaxSignalNameBytes bounds a signal name (a wait node's and a sent one's).
const MaxSignalNameBytes = 256

// LoopData is the data of a loop node.
type LoopData struct {
	// Over is a template giving an array: one iteration per item.
	Over string `json:"over,omitempty"`
	// Until is an expression over an iteration's input and steps; the loop
	// stops after the first iteration for which it is true.
	Until string `json:"until,omitempty"`
	// MaxIterations bounds the loop (default 100).
	MaxIterations int `json:"maxIterations,omitempty"`
	// With is passed to every iteration as input.with (a template over the
	// outer run).
	With json.RawMessage `json:"with,omitempty"`
	// Body is the workflow each iteration runs.
	Body json.RawMessage `json:"body"`
	// Concurrency is how many iterations may be in progress at once (1 to
	// MaxConcurrency; 0: one after another). The output keeps the items'
	// order whatever order they finish in.
	Concurrency int `json:"concurrency,omitempty"`
}

// DefaultMaxIterations bounds a loop that sets no maxIterations.
const DefaultMaxIterations = 100

// Iterations returns the effective iteration bound.
func (d *LoopData) Iterations() int {
	if d.MaxIterations <= 0 {
		return DefaultMaxIterations
	}
	return d.MaxIterations
}

// SubagentData is the data of a subagent node: a child run.
type SubagentData struct {
	Workflow json.RawMessage `json:"workflow"`
	// Input is the child's input; strings are templates.
	Input json.RawMessage `json:"input,omitempty"`
	// Queue is the child run's work queue; empty: the child workflow's.
	Queue string       `json:"queue,omitempty"`
	Retry *RetryPolicy `json:"retry,omitempty"`
}

// AgentTool declares tools the model may call: one the worker implements
// under Name, or (MCP set) the tools an MCP server of the worker's
// PAL_MCP_CONFIG lists, only those of Allow when it is set, or (Workflow
// set) a deployed workflow, each call a child run whose output is the
// call's result. An MCP server's list is journaled with the agent's first
// turn (engine.LLMOutput MCPTools), so a resumed agent offers the same
// tools.
type AgentTool struct {
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	MCP         string          `json:"mcp,omitempty"`
	Allow       []string        `json:"allow,omitempty"`
	// Workflow names a deployed workflow (PAL_WORKFLOWS): the model's call
	// starts its latest version as a child run, with the call's arguments
	// as input. The tool's name is Name, else the workflow's.
	Workflow string `json:"workflow,omitempty"`
}

// ToolName is the name the model calls the tool by: Name, or for a
// workflow tool without one the workflow's name.
func (t AgentTool) ToolName() string {
	if t.Name == "" {
		return t.Workflow
	}
	return t.Name
}

// AnyObject is the parameters of a workflow tool that gives none: any
// JSON object, the child run's input.
var AnyObject = json.RawMessage(`{"type":"object"}`)

// MCPSource names an MCP server whose tools an agent offers: all of them,
// or those Allow lists.
type MCPSource struct {
	Server string   `json:"server"`
	Allow  []string `json:"allow,omitempty"`
}

// MCPSources are the MCP servers the agent's tools name, in their order.
func (d *AgentData) MCPSources() []MCPSource {
	var out []MCPSource
	for _, t := range d.Tools {
		if t.MCP != "" {
			out = append(out, MCPSource{Server: t.MCP, Allow: t.Allow})
		}
	}
	return out
}

// AgentData is the data of an agent node: an LLM tool-use loop.
type AgentData struct {
	// Thread continues the run's thread (docs/architecture.md §7.3);
	// ThreadWindow, when set, sends only its last N turns.
	Thread       bool `json:"thread,omitempty"`
	ThreadWindow int  `json:"threadWindow,omitempty"`
	// Provider is required with one Model, absent with a fallback list.
	Provider    string       `json:"provider,omitempty"`
	Model       Model        `json:"model"`
	Prompt      string       `json:"prompt"`
	System      string       `json:"system,omitempty"`
	Tools       []AgentTool  `json:"tools,omitempty"`
	MaxTurns    int          `json:"maxTurns,omitempty"`
	MaxTokens   int          `json:"maxTokens,omitempty"`
	Temperature *float64     `json:"temperature,omitempty"`
	TimeoutMs   int          `json:"timeoutMs,omitempty"`
	Retry       *RetryPolicy `json:"retry,omitempty"`
	// Confidence gates the final answer (Node.Confidence).
	Confidence *ConfidenceGate `json:"confidence,omitempty"`
	// ParallelToolCalls runs the tool calls of one turn together (nil:
	// true); the next turn lists their results in the model's order.
	ParallelToolCalls *bool `json:"parallelToolCalls,omitempty"`
	// ResponseSchema, when set, is the JSON Schema the final answer must
	// match (each turn is asked for it).
	ResponseSchema json.RawMessage `json:"responseSchema,omitempty"`
	// Fake scripts pal dev's fake provider (Fake); real providers never
	// see it.
	Fake *Fake `json:"fake,omitempty"`
}

// DefaultMaxTurns bounds an agent that sets no maxTurns.
const DefaultMaxTurns = 10

// Turns returns the effective turn bound.
func (d *AgentData) Turns() int {
	if d.MaxTurns <= 0 {
		return DefaultMaxTurns
	}
	return d.MaxTurns
}

// Approval decodes the data of an approval node (which may have none).
func (n *Node) Approval() (*ApprovalData, error) {
	var d ApprovalData
	if err := n.decode(TypeApproval, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Wait decodes the data of a wait node.
func (n *Node) Wait() (*WaitData, error) {
	var d WaitData
	if err := n.decode(TypeWait, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// WaitsFor reports whether a wait node of w, or of a workflow nested in
// it (a loop body), waits for signal name.
func (w *Workflow) WaitsFor(name string) bool {
	for i := range w.Nodes {
		n := &w.Nodes[i]
		if n.Type == TypeWait {
			if d, err := n.Wait(); err == nil && d.Signal == name {
				return true
			}
		}
		if n.Type == TypeLoop {
			if sub, ok := w.Sub(n.ID); ok && sub.WaitsFor(name) {
				return true
			}
		}
	}
	return false
}

// Loop decodes the data of a loop node.
func (n *Node) Loop() (*LoopData, error) {
	var d LoopData
	if err := n.decode(TypeLoop, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Subagent decodes the data of a subagent node.
func (n *Node) Subagent() (*SubagentData, error) {
	var d SubagentData
	if err := n.decode(TypeSubagent, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Agent decodes the data of an agent node.
func (n *Node) Agent() (*AgentData, error) {
	var d AgentData
	if err := n.decode(TypeAgent, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Sub returns the parsed workflow nested in node id: a loop's body or a
// subagent's workflow. Parse checks and parses them once.
func (w *Workflow) Sub(id string) (*Workflow, bool) {
	s, ok := w.subs[id]
	return s, ok
}

// ConditionalRouting reports whether any edge out of node id has a
// condition: then the node's output decides where the run goes.
func (w *Workflow) ConditionalRouting(id string) bool {
	for _, e := range w.Outgoing(id) {
		if e.Condition != "" {
			return true
		}
	}
	return false
}

// checkNested parses a nested workflow document (loop body, subagent
// workflow) and reports its problems under the node's field.
func (w *Workflow) checkNested(n *Node, field string, raw json.RawMessage, ps *problems) *Workflow {
	if w.depth >= MaxWorkflowNesting {
		ps.node(n.ID, field, "workflows nested deeper than %d levels", MaxWorkflowNesting)
		return nil
	}
	sub, err := parseAt(raw, w.depth+1)
	if err != nil {
		ve, ok := err.(*ValidationError)
		if !ok {
			ps.node(n.ID, field, "%v", err)
			return nil
		}
		for _, p := range ve.Problems {
			ps.node(n.ID, field, "%s", strings.TrimPrefix(p.String(), "workflow: "))
		}
		return nil
	}
	if w.subs == nil {
		w.subs = map[string]*Workflow{}
	}
	w.subs[n.ID] = sub
	return sub
}

// checkNewNode checks the node types that hold nested workflows, park the
// run or loop a model (approval, loop, subagent, agent, wait).
func (w *Workflow) checkNewNode(n *Node, tmpl func(field, s string), tmplJSON func(field string, v json.RawMessage), decodeProblem func(error), ps *problems) {
	switch n.Type {
	case TypeApproval:
		d, err := n.Approval()
		if err != nil {
			decodeProblem(err)
			return
		}
		tmpl("data.prompt", d.Prompt)
	case TypeWait:
		if _, err := n.Wait(); err != nil {
			decodeProblem(err)
		}
	case TypeLoop:
		d, err := n.Loop()
		if err != nil {
			decodeProblem(err)
			return
		}
		if d.Over != "" {
			tmpl("data.over", d.Over)
		}
		tmplJSON("data.with", d.With)
		if d.Until != "" && d.Concurrency > 1 {
			ps.node(n.ID, "data.concurrency", "until stops the loop after the first iteration for which it is true, "+
				"in order; a loop with until runs one iteration at a time (drop concurrency, or until)")
		}
		body := w.checkNested(n, "data.body", d.Body, ps)
		if body != nil && d.Until != "" {
			if err := body.CheckExpression(d.Until); err != nil {
				ps.node(n.ID, "data.until", "%v", err)
			}
		}
	case TypeSubagent:
		d, err := n.Subagent()
		if err != nil {
			decodeProblem(err)
			return
		}
		tmplJSON("data.input", d.Input)
		w.checkNested(n, "data.workflow", d.Workflow, ps)
	case TypeProcess:
		d, err := n.Process()
		if err != nil {
			decodeProblem(err)
			return
		}
		checkProcess(n.ID, d, tmpl, ps)
		tmplJSON("data.input", d.Input)
	case TypeAgent:
		d, err := n.Agent()
		if err != nil {
			decodeProblem(err)
			return
		}
		tmpl("data.prompt", d.Prompt)
		tmpl("data.system", d.System)
		seen, servers := map[string]bool{}, map[string]bool{}
		for i, t := range d.Tools {
			field := fmt.Sprintf("data.tools[%d]", i)
			if t.MCP != "" && t.Workflow != "" {
				ps.node(n.ID, field, "a tool is an MCP server's (mcp) or a deployed workflow (workflow), not both")
				continue
			}
			if t.MCP != "" {
				if t.Name != "" || t.Description != "" || len(t.Parameters) > 0 {
					ps.node(n.ID, field, "an MCP server's tools (mcp %q) come with their names, descriptions and parameters: leave out name, description and parameters", t.MCP)
				}
				if servers[t.MCP] {
					ps.node(n.ID, field+".mcp", "MCP server %q is named twice; list its tools in one allow", t.MCP)
				}
				servers[t.MCP] = true
				continue
			}
			if t.ToolName() == "" {
				ps.node(n.ID, field, "a tool needs a name (a tool of the worker), mcp (an MCP server of PAL_MCP_CONFIG) or workflow (a deployed workflow)")
				continue
			}
			if len(t.Allow) > 0 {
				ps.node(n.ID, field+".allow", "allow lists an MCP server's tools: set mcp, or leave allow out")
			}
			if seen[t.ToolName()] {
				ps.node(n.ID, field+".name", "duplicate tool %q", t.ToolName())
			}
			seen[t.ToolName()] = true
		}
		checkLLM(n, d.Provider, d.Model, d.ResponseSchema, d.Retry, ps)
		checkThread(n, d.Thread, d.ThreadWindow, ps)
		checkFake(n, d.Fake, seen, len(servers) > 0, ps)
	}
}

// CheckExpression compiles an expression over this workflow's input and
// steps and checks the steps it names exist.
func (w *Workflow) CheckExpression(src string) error {
	c, err := w.exprs.get(src)
	if err != nil {
		return err
	}
	for _, r := range c.refs {
		if _, ok := w.byID[r.id]; !ok {
			return fmt.Errorf("steps.%s: no node %q%s", r.id, r.id, suggest(r.id, w.nodeIDs()))
		}
	}
	return nil
}
