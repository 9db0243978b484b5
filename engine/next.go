package engine

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// Action is what a run does next. It is one of Done, RunStep, Complete,
// Fail.
type Action interface{ isAction() }

// Done means the run has ended: nothing to do.
type Done struct{ Status Status }

// RunStep asks the worker to execute (or resume) one step.
type RunStep struct{ Plan StepPlan }

// Complete asks the worker to end the run successfully.
type Complete struct{ Output json.RawMessage }

// Fail asks the worker to end the run as failed.
type Fail struct {
	Code   string
	Error  string
	StepID string
}

func (Done) isAction()     {}
func (RunStep) isAction()  {}
func (Complete) isAction() {}
func (Fail) isAction()     {}

// Executors: what a worker does for a step.
const (
	ExecLLM       = "llm"
	ExecTool      = "tool"
	ExecConnector = "connector"
	ExecApproval  = "approval"
	ExecSubagent  = "subagent"
	ExecPure      = "pure"
)

// Error codes of run_failed added by the node types that decide routes.
const (
	CodeRejected = "approval_rejected"
	CodeMaxTurns = "max_turns"
	CodeLoop     = "loop"
)

// MaxDepth is how deep subagents may nest: a run at depth 5 may not start
// a child.
const MaxDepth = 5

// StepPlan describes a step to execute.
type StepPlan struct {
	// StepID is stable across replays: the node id, with the iteration
	// inside loops (each[3].fetch) and the turn and call inside agents
	// (ask.turn[2].tool[0]).
	StepID string
	NodeID string
	// NodeType is the type of the node the step belongs to (journaled in
	// step_started).
	NodeType string
	Node     *workflow.Node
	// Exec says which executor runs the step.
	Exec string
	// TimeoutMs is the node's timeoutMs (0: the executor's default).
	TimeoutMs int
	Attempt   int
	// Tries is how many tries the step had before this one.
	Tries int
	// Key is the idempotency key of this attempt.
	Key string
	// Input is the rendered input (journaled in step_started).
	Input json.RawMessage
	// Started is true when this attempt already has a step_started: the
	// step is being resumed after a crash and its outcome is unknown.
	Started bool
	// Claimed and Delivered describe the attempt's side effect, if any.
	Claimed   bool
	Delivered bool
	// NotBefore is when a retry may start (zero: now).
	NotBefore time.Time
	// Output is set for steps that need no I/O: the worker journals it
	// directly.
	Output json.RawMessage
	// Pure is true when Output is set.
	Pure bool
	// Wait is set for a step that must wait for an outside input (an
	// approval): the worker journals step_waiting and parks the run.
	Wait *WaitPlan
	// ChildRunID is the child run of a subagent step.
	ChildRunID string
}

// WaitPlan describes a step that waits.
type WaitPlan struct {
	Reason string
	// Waiting is true when step_waiting is already journaled.
	Waiting bool
	// TimeoutMs is how long to wait (0: forever).
	TimeoutMs int
	// TimeoutAt is when a journaled wait times out (zero: never).
	TimeoutAt time.Time
}

// Next decides the run's next action from its workflow and folded state.
// It is pure: the same inputs always give the same action. A waiting run
// gets the same answer as a running one: a RunStep whose Wait says it is
// still waiting, or the step that its new input (a decision) unblocks.
func Next(wf *workflow.Workflow, st *RunState) Action {
	if st.Status.Terminal() {
		return Done{Status: st.Status}
	}
	if wf == nil {
		msg := "run has no workflow"
		if st.WorkflowErr != nil {
			msg = fmt.Sprintf("workflow snapshot does not parse: %v", st.WorkflowErr)
		}
		return Fail{Code: event.CodeInvalidWorkflow, Error: msg}
	}
	a, out := walk(wf, st, "", st.Input())
	if a != nil {
		return a
	}
	return Complete{Output: out}
}

// walk walks one graph: the run's workflow (prefix "") or one iteration
// of a loop body (prefix "each[3]."). It returns the action to take, or a
// nil action and the scope's output (that of its last completed step, or
// its input when nothing ran) when every node is resolved.
func walk(wf *workflow.Workflow, st *RunState, prefix string, input any) (Action, json.RawMessage) {
	var env workflow.Env
	if prefix == "" && wf == st.Workflow && st.outputs != nil {
		env = workflow.Env{Input: input, Steps: st.outputs}
	} else {
		env = scopeEnv(st, wf, prefix, input)
	}
	// state holds, per node index, 1 for resolved (dead) and 2 for
	// completed.
	const (
		isResolved  = 1
		isCompleted = 2
	)
	state := make([]uint8, len(wf.Nodes))
	resolved := func(id string) bool { return state[wf.Index(id)] != 0 }
	completed := func(id string) bool { return state[wf.Index(id)] == isCompleted }
	var last *Step
nodes:
	for _, id := range wf.OrderShared() {
		idx := wf.Index(id)
		node := &wf.Nodes[idx]
		if node.Type == workflow.TypeTrigger {
			state[idx] = isCompleted
			continue
		}
		sid := id
		if prefix != "" {
			sid = prefix + id
		}
		fired := false
		for _, e := range wf.IncomingShared(id) {
			if !resolved(e.From) {
				continue nodes // pending: a source has not run yet
			}
			if completed(e.From) && !fired {
				ok, err := wf.EdgeFires(e, env)
				if err != nil {
					return Fail{Code: event.CodeStepFailed, StepID: sid, Error: err.Error()}, nil
				}
				fired = ok
			}
		}
		if !fired {
			state[idx] = isResolved // dead: no incoming edge fired
			continue
		}
		if s, ok := st.Steps[sid]; ok {
			switch s.Status {
			case StepCompleted:
				if node.Type == workflow.TypeApproval && !wf.ConditionalRouting(id) {
					if f, failed := rejected(s, sid); failed {
						return f, nil
					}
				}
				state[idx] = isCompleted
				if last == nil || s.CompletedSeq > last.CompletedSeq {
					last = s
				}
				continue
			case StepFailed:
				return Fail{Code: event.CodeStepFailed, StepID: sid,
					Error: fmt.Sprintf("step %s failed: %s", sid, s.Error)}, nil
			}
		}
		switch node.Type {
		case workflow.TypeLoop:
			return planLoop(wf, st, node, sid, env), nil
		case workflow.TypeAgent:
			return planAgent(st, node, sid, env), nil
		default:
			return planStep(wf, st, node, sid, env), nil
		}
	}
	if last != nil && len(last.Output) > 0 {
		return nil, last.Output
	}
	out, err := json.Marshal(input)
	if err != nil || len(out) == 0 {
		out = json.RawMessage("null")
	}
	return nil, out
}

// rejected fails the run at an approval that was not approved, when no
// edge routes on the decision.
func rejected(s *Step, sid string) (Fail, bool) {
	var out event.ApprovalOutput
	if err := json.Unmarshal(s.Output, &out); err != nil || out.Approved {
		return Fail{}, false
	}
	msg := fmt.Sprintf("step %s was rejected", sid)
	switch {
	case out.TimedOut:
		msg = fmt.Sprintf("step %s timed out waiting for an approval", sid)
	case out.Approver != "":
		msg = fmt.Sprintf("step %s was rejected by %s", sid, out.Approver)
	}
	if out.Comment != "" {
		msg += ": " + out.Comment
	}
	return Fail{Code: CodeRejected, StepID: sid, Error: msg}, true
}

// basePlan fills the attempt, key and resume state of step sid.
func basePlan(st *RunState, node *workflow.Node, sid, exec string) StepPlan {
	p := StepPlan{StepID: sid, NodeID: node.ID, NodeType: node.Type, Node: node, Exec: exec, Attempt: 1}
	if s, ok := st.Steps[sid]; ok {
		p.Attempt = max(s.Attempt, 1)
		p.Tries = s.Retries
		switch s.Status {
		case StepRunning, StepWaiting:
			p.Started = true
			p.Input = s.Input
			p.Claimed, p.Delivered = s.Claimed, s.Delivered
		case StepRetrying:
			p.NotBefore = s.RetryAt
			p.Claimed, p.Delivered = s.Claimed, s.Delivered
		}
	}
	p.Key = event.IdempotencyKey(st.RunID, sid, p.Attempt)
	return p
}

func planStep(wf *workflow.Workflow, st *RunState, node *workflow.Node, sid string, env workflow.Env) Action {
	exec := map[string]string{workflow.TypeAIStep: ExecLLM, workflow.TypeTool: ExecTool, workflow.TypeConnector: ExecConnector,
		workflow.TypeCondition: ExecPure, workflow.TypeApproval: ExecApproval, workflow.TypeSubagent: ExecSubagent}[node.Type]
	p := basePlan(st, node, sid, exec)
	fail := func(format string, args ...any) Action {
		return Fail{Code: event.CodeStepFailed, StepID: sid, Error: fmt.Sprintf("step %s: ", sid) + fmt.Sprintf(format, args...)}
	}
	if p.Input == nil {
		in, err := RenderInput(node, env)
		if err != nil {
			return fail("%v", err)
		}
		p.Input = in
	}
	switch node.Type {
	case workflow.TypeAIStep, workflow.TypeTool, workflow.TypeConnector:
		p.TimeoutMs = nodeTimeout(node)
	case workflow.TypeCondition:
		d, err := node.Condition()
		if err != nil {
			return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: err.Error()}
		}
		v, err := wf.Eval(d.Expression, env)
		if err != nil {
			return fail("expression %q: %v", d.Expression, err)
		}
		out, err := json.Marshal(map[string]any{"result": v})
		if err != nil {
			return fail("%v", err)
		}
		p.Output, p.Pure = out, true
	case workflow.TypeApproval:
		d, err := node.Approval()
		if err != nil {
			return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: err.Error()}
		}
		if dec, ok := st.Decisions[sid]; ok {
			out, _ := json.Marshal(event.ApprovalOutput{Approved: dec.Decision == event.DecisionApprove,
				Decision: dec.Decision, Approver: dec.Approver, Comment: dec.Comment})
			p.Output, p.Pure = out, true
			return RunStep{Plan: p}
		}
		p.Wait = &WaitPlan{Reason: event.WaitApproval, TimeoutMs: d.TimeoutMs}
		if s, ok := st.Steps[sid]; ok && s.Status == StepWaiting {
			p.Wait.Waiting, p.Wait.TimeoutAt = true, s.TimeoutAt
		}
	case workflow.TypeSubagent:
		depth := st.Created.Depth + 1
		if depth > MaxDepth {
			return Fail{Code: event.CodeDepthExceeded, StepID: sid, Error: fmt.Sprintf(
				"step %s would start a subagent at depth %d, over the limit of %d (chain: %s)", sid, depth, MaxDepth, chainString(st))}
		}
		p.ChildRunID = event.ChildRunID(st.RunID, sid)
	}
	return RunStep{Plan: p}
}

// Chain returns the run ids from the root run down to this run, from the
// journal (run_created's trigger_meta.chain).
func Chain(st *RunState) []string {
	var out []string
	if raw, ok := st.Created.TriggerMeta["chain"].([]any); ok {
		for _, v := range raw {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
	}
	return append(out, st.RunID)
}

func chainString(st *RunState) string {
	c := Chain(st)
	s := ""
	for i, id := range c {
		if i > 0 {
			s += " → "
		}
		s += id
	}
	return s
}

func nodeTimeout(node *workflow.Node) int {
	var d struct {
		TimeoutMs int `json:"timeoutMs"`
	}
	_ = json.Unmarshal(node.Data, &d)
	return d.TimeoutMs
}

// planLoop walks the loop's iterations in order: the first unfinished
// one decides the next step; when all are done (or until is met) the loop
// step completes with {"iterations","results","stopped"}.
func planLoop(wf *workflow.Workflow, st *RunState, node *workflow.Node, sid string, env workflow.Env) Action {
	fail := func(format string, args ...any) Action {
		return Fail{Code: CodeLoop, StepID: sid, Error: fmt.Sprintf("loop %s: ", sid) + fmt.Sprintf(format, args...)}
	}
	d, err := node.Loop()
	if err != nil {
		return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: err.Error()}
	}
	body, ok := wf.Sub(node.ID)
	if !ok {
		return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: "loop has no parsed body"}
	}
	n := d.Iterations()
	var items []any
	stopped := "max_iterations"
	if d.Over != "" {
		raw, err := workflow.RenderJSON(json.RawMessage(strconv.Quote(d.Over)), env)
		if err != nil {
			return fail("over: %v", err)
		}
		v := decode(raw)
		arr, ok := v.([]any)
		if !ok {
			return fail("over gave %s, want an array", string(raw))
		}
		if len(arr) > n {
			return fail("over gave %d items, more than maxIterations (%d)", len(arr), n)
		}
		items, n, stopped = arr, len(arr), "items"
	}
	var with any
	if len(d.With) > 0 {
		raw, err := workflow.RenderJSON(d.With, env)
		if err != nil {
			return fail("with: %v", err)
		}
		with = decode(raw)
	}
	results := []json.RawMessage{}
	for i := 0; i < n; i++ {
		var item any
		if items != nil {
			item = items[i]
		}
		in := map[string]any{"item": item, "index": i, "with": with}
		prefix := sid + "[" + strconv.Itoa(i) + "]."
		a, out := walk(body, st, prefix, in)
		if a != nil {
			return a
		}
		results = append(results, out)
		if d.Until != "" {
			v, err := body.Eval(d.Until, scopeEnv(st, body, prefix, in))
			if err != nil {
				return fail("until: %v", err)
			}
			if b, _ := v.(bool); b {
				stopped = "until"
				break
			}
		}
	}
	p := basePlan(st, node, sid, ExecPure)
	p.Input, _ = json.Marshal(map[string]any{"iterations": len(results)})
	p.Output, _ = json.Marshal(map[string]any{"iterations": len(results), "results": results, "stopped": stopped})
	p.Pure = true
	return RunStep{Plan: p}
}

// agentTurnOutput is what a model turn's step_completed holds.
type agentTurnOutput struct {
	Text      string              `json:"text"`
	ToolCalls []provider.ToolCall `json:"tool_calls"`
}

// planAgent replays the agent's turns from the journal: every completed
// model turn and tool call is reused, so a resumed agent sends only the
// turn it was in. Each turn's request is the whole conversation so far.
func planAgent(st *RunState, node *workflow.Node, sid string, env workflow.Env) Action {
	d, err := node.Agent()
	if err != nil {
		return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: err.Error()}
	}
	system, err := workflow.RenderString(d.System, env)
	if err != nil {
		return Fail{Code: event.CodeStepFailed, StepID: sid, Error: fmt.Sprintf("step %s: system: %v", sid, err)}
	}
	prompt, err := workflow.RenderString(d.Prompt, env)
	if err != nil {
		return Fail{Code: event.CodeStepFailed, StepID: sid, Error: fmt.Sprintf("step %s: prompt: %v", sid, err)}
	}
	var tools []provider.Tool
	for _, t := range d.Tools {
		tools = append(tools, provider.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
	}
	msgs := []provider.Message{{Role: provider.RoleUser, Content: prompt}}
	for k := 0; ; k++ {
		if k >= d.Turns() {
			return Fail{Code: CodeMaxTurns, StepID: sid, Error: fmt.Sprintf("agent %s used all %d turns without a final answer", sid, d.Turns())}
		}
		tid := sid + ".turn[" + strconv.Itoa(k) + "]"
		ts := st.Steps[tid]
		if ts == nil || ts.Status != StepCompleted {
			if ts != nil && ts.Status == StepFailed {
				return Fail{Code: event.CodeStepFailed, StepID: tid, Error: fmt.Sprintf("step %s failed: %s", tid, ts.Error)}
			}
			p := basePlan(st, node, tid, ExecLLM)
			p.TimeoutMs = d.TimeoutMs
			if p.Input == nil {
				p.Input, _ = json.Marshal(AIInput{Provider: d.Provider, Model: d.Model, System: system, Messages: msgs,
					Tools: tools, MaxTokens: d.MaxTokens, Temperature: d.Temperature})
			}
			return RunStep{Plan: p}
		}
		var out agentTurnOutput
		if err := json.Unmarshal(ts.Output, &out); err != nil {
			return Fail{Code: event.CodeStepFailed, StepID: tid, Error: fmt.Sprintf("step %s: output: %v", tid, err)}
		}
		if len(out.ToolCalls) == 0 {
			p := basePlan(st, node, sid, ExecPure)
			p.Input, _ = json.Marshal(map[string]any{"turns": k + 1})
			p.Output, _ = json.Marshal(map[string]any{"text": out.Text, "turns": k + 1})
			p.Pure = true
			return RunStep{Plan: p}
		}
		msgs = append(msgs, provider.Message{Role: provider.RoleAssistant, Content: out.Text, ToolCalls: out.ToolCalls})
		for j, call := range out.ToolCalls {
			cid := tid + ".tool[" + strconv.Itoa(j) + "]"
			cs := st.Steps[cid]
			if cs == nil || (cs.Status != StepCompleted && cs.Status != StepFailed) {
				p := basePlan(st, node, cid, ExecTool)
				p.TimeoutMs = d.TimeoutMs
				if p.Input == nil {
					args := call.Arguments
					if len(args) == 0 {
						args = json.RawMessage("{}")
					}
					p.Input, _ = json.Marshal(map[string]any{"tool": call.Name, "input": args, "tool_call_id": call.ID})
				}
				return RunStep{Plan: p}
			}
			content := string(cs.Output)
			if cs.Status == StepFailed {
				// The model sees a failed tool as its answer, not the run.
				b, _ := json.Marshal(map[string]string{"error": cs.Error})
				content = string(b)
			}
			msgs = append(msgs, provider.Message{Role: provider.RoleTool, ToolCallID: call.ID, Content: content})
		}
	}
}

// Env returns the template and condition environment of a run: its input
// and the outputs of its completed top-level steps (the trigger's output
// is the input).
func Env(st *RunState) workflow.Env {
	if st.Workflow == nil {
		return workflow.Env{Input: st.Input(), Steps: map[string]any{}}
	}
	return scopeEnv(st, st.Workflow, "", st.Input())
}

// scopeEnv is the environment of one scope: input, and the outputs of the
// completed steps of wf under prefix, by node id.
func scopeEnv(st *RunState, wf *workflow.Workflow, prefix string, input any) workflow.Env {
	steps := make(map[string]any, len(wf.Nodes))
	for i := range wf.Nodes {
		n := &wf.Nodes[i]
		if n.Type == workflow.TypeTrigger {
			steps[n.ID] = input
			continue
		}
		if s, ok := st.Steps[prefix+n.ID]; ok && s.Status == StepCompleted {
			steps[n.ID] = s.OutputValue()
		}
	}
	return workflow.Env{Input: input, Steps: steps}
}

// RetryDecision says whether a failed try of plan is retried under its
// node's policy, and with which attempt number: the same attempt (and so
// the same idempotency key) when the outcome of the failed call is unknown,
// the next one otherwise. classes are the error's retry classes; the
// policy retries if it names any of them (or "any").
func RetryDecision(plan StepPlan, classes []string, retryable, unknown bool) (retry bool, attempt, of int) {
	pol := plan.Node.Retry()
	of = pol.Attempts()
	allowed := false
	for _, c := range classes {
		allowed = allowed || pol.Retries(c)
	}
	if !retryable || !allowed || plan.Tries+1 >= of {
		return false, plan.Attempt, of
	}
	if unknown {
		return true, plan.Attempt, of
	}
	return true, plan.Attempt + 1, of
}

// NodeForStep finds the node a step id belongs to: "ok", or a node inside
// loop iterations ("each[2].ok", "outer[0].inner[3].ok"). Agent turns and
// tool calls have no node of their own; they return false.
func NodeForStep(wf *workflow.Workflow, stepID string) (*workflow.Node, bool) {
	cur := wf
	rest := stepID
	for cur != nil {
		seg, tail, more := cutSegment(rest)
		name, indexed := seg, false
		if i := indexOfBracket(seg); i >= 0 {
			if seg[len(seg)-1] != ']' {
				return nil, false
			}
			if _, err := strconv.Atoi(seg[i+1 : len(seg)-1]); err != nil {
				return nil, false
			}
			name, indexed = seg[:i], true
		}
		n, ok := cur.Node(name)
		if !ok {
			return nil, false
		}
		if !more {
			return n, !indexed
		}
		if !indexed || n.Type != workflow.TypeLoop {
			return nil, false
		}
		cur, _ = cur.Sub(name)
		rest = tail
	}
	return nil, false
}

func cutSegment(s string) (seg, rest string, more bool) {
	depth := 0
	for i, r := range s {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case '.':
			if depth == 0 {
				return s[:i], s[i+1:], true
			}
		}
	}
	return s, "", false
}

func indexOfBracket(s string) int {
	for i, r := range s {
		if r == '[' {
			return i
		}
	}
	return -1
}
