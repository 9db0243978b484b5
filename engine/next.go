package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// Action is what a run does next. It is one of Done, RunStep, Complete,
// Fail, and the brakes' Note and Park.
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
	// Attempts is journaled with process_resume_exhausted.
	Attempts int
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
	ExecWait      = "wait"
	ExecPure      = "pure"
	ExecProcess   = "process"
)

// Error codes of run_failed added by the node types that decide routes.
const (
	CodeRejected = "approval_rejected"
	CodeMaxTurns = "max_turns"
	CodeLoop     = "loop"
	// CodeSignalTimeout fails a run whose wait node timed out with no
	// edge routing on it.
	CodeSignalTimeout = "signal_timeout"
)

// MaxDepth is how deep subagents may nest: a run at depth 5 may not start
// a child.
const MaxDepth = 5

// StepPlan describes a step to execute.
type StepPlan struct {
	// StepID is stable across replays: the node id, with the iteration
	// inside loops (each[3].fetch) and the turn and call inside agents
	// (ask.turn[2].tool[0]): the String of a StepID.
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
	// Request, when set, is what the executor gets instead of Input: an
	// agent turn journals only the messages added since its previous turn
	// (AIInput.Prior), and Request is the whole conversation, rebuilt
	// from the journal. Call returns the one to execute.
	Request json.RawMessage
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
	// Resumes counts the drives that found this process step's attempt
	// running: its earlier processes did not finish (PAL_RESUME).
	Resumes int
	// Confidence is the confidence gate of an LLM step that has not been
	// scored yet: the worker scores its answer and journals
	// confidence_evaluated. Nil for steps of ungated nodes.
	Confidence *workflow.ConfidenceGate
	// GateOff: the node has a gate, and the workflow's policy turns it
	// off: the worker journals confidence_gate_bypassed (once).
	GateOff bool
	// Gate is set for a gated step whose score is journaled: what is left
	// is its verdict (with Wait set while it waits for an approver).
	Gate *GatePlan
	// SignalSeq is the seq of the signal a wait step takes (journaled in
	// its step_completed).
	SignalSeq uint64
	// CopiedFrom is set when a fork copies the step from its source run:
	// Output is the source's, and nothing is executed.
	CopiedFrom *event.CopiedFrom
}

// WaitPlan describes a step that waits. A wait whose time is up is not
// planned as a wait: Next plans the step's timed-out completion instead.
type WaitPlan struct {
	Reason string
	// Signal is the signal a wait node waits for ("" for an approval).
	Signal string
	// Waiting is true when step_waiting is already journaled.
	Waiting bool
	// TimeoutMs is how long to wait (0: forever).
	TimeoutMs int
	// TimeoutAt is when the wait times out (zero: never): the journaled
	// deadline, or for a new wait now plus TimeoutMs, which the worker
	// journals in step_waiting.
	TimeoutAt time.Time
}

// Next decides the run's next action from its workflow and folded state at
// time now. It is pure: the same inputs always give the same action. now
// decides only waits: an approval whose deadline is not after now has
// timed out. A waiting run gets the same answer as a running one: a
// RunStep whose Wait says it is still waiting, or the step that its new
// input (a decision, or the passing of its deadline) unblocks.
func Next(wf *workflow.Workflow, st *RunState, now time.Time) Action {
	return NextContext(context.Background(), wf, st, now)
}

// NextContext is Next with a context that interrupts the evaluation of
// conditions (a cancelled run, a lost lease frees the worker at once).
// The action it returns after ctx has ended is not to be acted on.
func NextContext(ctx context.Context, wf *workflow.Workflow, st *RunState, now time.Time) Action {
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
	if b := st.brakesBefore(); b != nil {
		return b
	}
	var env workflow.Env
	if wf == st.Workflow && st.outputs != nil {
		env = workflow.Env{Input: st.Input(), Steps: st.outputs}
	} else {
		env = scopeEnv(st, wf, nil, st.Input())
	}
	a, out := walk(ctx, wf, st, nil, env, now)
	if rs, ok := a.(RunStep); ok {
		// A step a fork copies is not executed, so no brake applies to it.
		if p, ok := copied(st, rs.Plan); ok {
			return RunStep{Plan: p}
		}
		if b := st.brakesAt(rs.Plan, now); b != nil {
			return b
		}
	}
	if a != nil {
		return a
	}
	return Complete{Output: out}
}

// copied replaces the plan of a step a fork copies (run_created's
// forked_from.copies) with its source output: the step completes without
// being executed, whatever its type.
func copied(st *RunState, p StepPlan) (StepPlan, bool) {
	c, ok := st.copies[p.StepID]
	if !ok {
		return p, false
	}
	if s, ok := st.Steps[p.StepID]; ok && s.Status == StepCompleted {
		return p, false
	}
	out := c.Output
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	p.Exec, p.Wait, p.ChildRunID, p.SignalSeq = ExecPure, nil, "", 0
	// The input stays the rendered one: what the step would have sent.
	p.Output, p.Pure = out, true
	p.CopiedFrom = &event.CopiedFrom{RunID: st.Created.ForkedFrom.RunID, Seq: c.Seq, NodeHash: c.NodeHash}
	return p, true
}

// walk walks one graph: the run's workflow (scope nil) or one iteration of
// a loop body (scope each[3]) in its environment env. It returns the
// action to take, or a nil action and the scope's output (that of its last
// completed step, or its input when nothing ran) when every node is
// resolved.
func walk(ctx context.Context, wf *workflow.Workflow, st *RunState, scope []Iteration, env workflow.Env, now time.Time) (Action, json.RawMessage) {
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
		stepID := StepID{Loops: scope, Node: id}
		fired := false
		for _, e := range wf.IncomingShared(id) {
			if !resolved(e.From) {
				continue nodes // pending: a source has not run yet
			}
			if completed(e.From) && !fired {
				ok, err := wf.EdgeFiresContext(ctx, e, env)
				if err != nil {
					return Fail{Code: event.CodeStepFailed, StepID: stepID.String(), Error: err.Error()}, nil
				}
				fired = ok
			}
		}
		if !fired {
			state[idx] = isResolved // dead: no incoming edge fired
			continue
		}
		if s, ok := st.stepAt(scope, id); ok {
			switch s.Status {
			case StepCompleted:
				if node.Type == workflow.TypeApproval && !wf.ConditionalRouting(id) {
					if f, failed := rejected(s, stepID.String()); failed {
						return f, nil
					}
				}
				if node.Type == workflow.TypeWait && !wf.ConditionalRouting(id) && waitTimedOut(s) {
					sid := stepID.String()
					return Fail{Code: CodeSignalTimeout, StepID: sid,
						Error: fmt.Sprintf("step %s timed out waiting for a signal", sid)}, nil
				}
				state[idx] = isCompleted
				if last == nil || s.CompletedSeq > last.CompletedSeq {
					last = s
				}
				continue
			case StepFailed:
				sid := stepID.String()
				return Fail{Code: failCode(s), StepID: sid,
					Error: fmt.Sprintf("step %s failed: %s", sid, s.Error)}, nil
			}
		}
		switch node.Type {
		case workflow.TypeLoop:
			return planLoop(ctx, wf, st, node, stepID, env, now), nil
		case workflow.TypeAgent:
			return planAgent(st, node, stepID, env), nil
		default:
			return planStep(ctx, wf, st, node, stepID.String(), env, now), nil
		}
	}
	if last != nil && len(last.Output) > 0 {
		return nil, last.Output
	}
	out, err := json.Marshal(env.Input)
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

// waitTimedOut reports whether a completed wait step timed out: it took
// no signal (a copied step: its output says so).
func waitTimedOut(s *Step) bool {
	if s.SignalSeq != 0 {
		return false
	}
	if s.CopiedFrom == nil {
		return true
	}
	var out event.SignalTimeoutOutput
	return json.Unmarshal(s.Output, &out) == nil && out.TimedOut && out.Signal != ""
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

func planStep(ctx context.Context, wf *workflow.Workflow, st *RunState, node *workflow.Node, sid string, env workflow.Env, now time.Time) Action {
	exec := map[string]string{workflow.TypeAIStep: ExecLLM, workflow.TypeTool: ExecTool, workflow.TypeConnector: ExecConnector,
		workflow.TypeCondition: ExecPure, workflow.TypeApproval: ExecApproval, workflow.TypeSubagent: ExecSubagent,
		workflow.TypeProcess: ExecProcess, workflow.TypeWait: ExecWait}[node.Type]
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
	case workflow.TypeAIStep:
		p.TimeoutMs = nodeTimeout(node)
		gateStep(st, node, &p)
	case workflow.TypeTool, workflow.TypeConnector:
		p.TimeoutMs = nodeTimeout(node)
	case workflow.TypeProcess:
		d, err := node.Process()
		if err != nil {
			return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: err.Error()}
		}
		p.TimeoutMs = d.TimeoutMs
		if s, ok := st.Steps[sid]; ok && p.Started {
			p.Resumes = s.Resumes
		}
		if p.Resumes > d.Resumes() {
			return Fail{Code: event.CodeProcessResumeExhausted, StepID: sid, Attempts: p.Resumes,
				Error: fmt.Sprintf("step %s: %d processes started for it did not finish, over its maxResumes of %d re-drives; giving up",
					sid, p.Resumes, d.Resumes())}
		}
	case workflow.TypeCondition:
		d, err := node.Condition()
		if err != nil {
			return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: err.Error()}
		}
		v, err := wf.EvalContext(ctx, d.Expression, env)
		if err != nil {
			return fail("expression %q: %v", d.Expression, err)
		}
		out, err := json.Marshal(ConditionOutput{Result: v})
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
		} else if d.TimeoutMs > 0 {
			p.Wait.TimeoutAt = now.Add(time.Duration(d.TimeoutMs) * time.Millisecond).UTC()
		}
		if p.Wait.Waiting && !p.Wait.TimeoutAt.IsZero() && !now.Before(p.Wait.TimeoutAt) {
			// The deadline has passed: the step completes as timed out,
			// which routes along an edge on timed_out or fails the run.
			out, _ := json.Marshal(event.ApprovalOutput{Decision: event.DecisionTimeout, TimedOut: true})
			p.Wait, p.Output, p.Pure = nil, out, true
		}
	case workflow.TypeWait:
		d, err := node.Wait()
		if err != nil {
			return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: err.Error()}
		}
		if sg := st.PendingSignal(d.Signal); sg != nil {
			// The oldest signal of its name not yet taken, even one sent
			// before the run got here.
			out := sg.Payload
			if len(out) == 0 {
				out = json.RawMessage("null")
			}
			p.Output, p.Pure, p.SignalSeq = out, true, sg.Seq
			return RunStep{Plan: p}
		}
		p.Wait = &WaitPlan{Reason: event.WaitSignal, Signal: d.Signal, TimeoutMs: d.TimeoutMs}
		if s, ok := st.Steps[sid]; ok && s.Status == StepWaiting {
			p.Wait.Waiting, p.Wait.TimeoutAt = true, s.TimeoutAt
		} else if d.TimeoutMs > 0 {
			p.Wait.TimeoutAt = now.Add(time.Duration(d.TimeoutMs) * time.Millisecond).UTC()
		}
		if p.Wait.Waiting && !p.Wait.TimeoutAt.IsZero() && !now.Before(p.Wait.TimeoutAt) {
			out, _ := json.Marshal(event.SignalTimeoutOutput{Signal: d.Signal, TimedOut: true})
			p.Wait, p.Output, p.Pure = nil, out, true
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

// ChildTriggerMeta is the trigger_meta of the child run that step stepID
// of st starts: its parent, and the chain that Chain reads back in the
// child.
func ChildTriggerMeta(st *RunState, stepID string) map[string]any {
	return map[string]any{"parent_run_id": st.RunID, "parent_step_id": stepID, "chain": Chain(st)}
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
// step completes with {"iterations","results","stopped"}. The iterations
// found finished are memoized in st (loopMemo), so each call walks from
// the first unfinished one: a step's cost does not grow with the
// iterations before it.
func planLoop(ctx context.Context, wf *workflow.Workflow, st *RunState, node *workflow.Node, id StepID, env workflow.Env, now time.Time) Action {
	sid := id.String()
	fail := func(format string, args ...any) Action {
		return Fail{Code: CodeLoop, StepID: sid, Error: fmt.Sprintf("loop %s: ", sid) + fmt.Sprintf(format, args...)}
	}
	d, err := st.loopData(node)
	if err != nil {
		return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: err.Error()}
	}
	body, ok := wf.Sub(node.ID)
	if !ok {
		return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: "loop has no parsed body"}
	}
	n := d.Iterations()
	var overRaw, withRaw json.RawMessage
	stopped := LoopStoppedMax
	if d.Over != "" {
		if overRaw, err = workflow.RenderJSON(json.RawMessage(strconv.Quote(d.Over)), env); err != nil {
			return fail("over: %v", err)
		}
	}
	if len(d.With) > 0 {
		if withRaw, err = workflow.RenderJSON(d.With, env); err != nil {
			return fail("with: %v", err)
		}
	}
	m := st.loopMemo(sid, body, overRaw, withRaw)
	if d.Over != "" {
		arr, ok := m.items.([]any)
		if !ok {
			return fail("over gave %s, want an array", string(overRaw))
		}
		if len(arr) > n {
			return fail("over gave %d items, more than maxIterations (%d)", len(arr), n)
		}
		n, stopped = len(arr), LoopStoppedItems
	}
	results := m.results
	for i := m.done; i < n; i++ {
		var item any
		if d.Over != "" {
			item = m.items.([]any)[i]
		}
		in := map[string]any{"item": item, "index": i, "with": m.with}
		scope := id.iteration(i)
		ienv := scopeEnv(st, body, scope, in)
		a, out := walk(ctx, body, st, scope, ienv, now)
		if a != nil {
			return a
		}
		if d.Until != "" {
			v, err := body.EvalContext(ctx, d.Until, ienv)
			if err != nil {
				return fail("until: %v", err)
			}
			if b, _ := v.(bool); b {
				stopped = LoopStoppedUntil
				results = append(results[:i:i], out)
				break
			}
		}
		results = append(results, out)
		if ctx.Err() == nil {
			// Finished, and the loop goes on: no later event but one of
			// this iteration's steps (which Apply watches for) changes that.
			m.results, m.done = results, i+1
		}
	}
	if results == nil {
		results = []json.RawMessage{}
	}
	p := basePlan(st, node, sid, ExecPure)
	p.Input, _ = json.Marshal(LoopInput{Iterations: len(results)})
	p.Output, _ = json.Marshal(LoopOutput{Iterations: len(results), Results: results, Stopped: stopped})
	p.Pure = true
	return RunStep{Plan: p}
}

// Call is the input the executor runs the step with: Request when set,
// else Input.
func (p StepPlan) Call() json.RawMessage {
	if p.Request != nil {
		return p.Request
	}
	return p.Input
}

// planAgent replays the agent's turns from the journal: every completed
// model turn and tool call is reused, so a resumed agent sends only the
// turn it was in. Each turn's request is the whole conversation so far,
// but its step_started journals only the messages added since the
// previous turn (AIInput.Prior counts the earlier ones): the journal
// grows with the turns, not with their square.
func planAgent(st *RunState, node *workflow.Node, id StepID, env workflow.Env) Action {
	sid := id.String()
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
	sent := 0 // the messages of the previous turn's request
	for k := 0; ; k++ {
		if k >= d.Turns() {
			return Fail{Code: CodeMaxTurns, StepID: sid, Error: fmt.Sprintf("agent %s used all %d turns without a final answer", sid, d.Turns())}
		}
		turn := id.AgentTurn(k)
		tid := turn.String()
		ts := st.Steps[tid]
		if ts == nil || ts.Status != StepCompleted {
			if ts != nil && ts.Status == StepFailed {
				return Fail{Code: failCode(ts), StepID: tid, Error: fmt.Sprintf("step %s failed: %s", tid, ts.Error)}
			}
			p := basePlan(st, node, tid, ExecLLM)
			p.TimeoutMs = d.TimeoutMs
			gateStep(st, node, &p)
			if p.Input == nil {
				p.Input, _ = json.Marshal(AIInput{Provider: d.Provider, Model: d.Model, System: system, Messages: msgs[sent:],
					Prior: sent, Tools: tools, MaxTokens: d.MaxTokens, Temperature: d.Temperature})
			}
			req, err := turnRequest(p.Input, msgs)
			if err != nil {
				return Fail{Code: event.CodeStepFailed, StepID: tid, Error: fmt.Sprintf("step %s: input: %v", tid, err)}
			}
			p.Request = req
			return RunStep{Plan: p}
		}
		sent = len(msgs)
		var out LLMOutput
		if err := json.Unmarshal(ts.Output, &out); err != nil {
			return Fail{Code: event.CodeStepFailed, StepID: tid, Error: fmt.Sprintf("step %s: output: %v", tid, err)}
		}
		if len(out.ToolCalls) == 0 {
			p := basePlan(st, node, sid, ExecPure)
			p.Input, _ = json.Marshal(AgentInput{Turns: k + 1})
			p.Output, _ = json.Marshal(AgentOutput{Text: out.Text, Turns: k + 1, Confidence: out.Confidence})
			p.Pure = true
			return RunStep{Plan: p}
		}
		msgs = append(msgs, provider.Message{Role: provider.RoleAssistant, Content: out.Text, ToolCalls: out.ToolCalls})
		for j, call := range out.ToolCalls {
			cid := turn.ToolCall(j).String()
			cs := st.Steps[cid]
			if cs == nil || (cs.Status != StepCompleted && cs.Status != StepFailed) {
				p := basePlan(st, node, cid, ExecTool)
				p.TimeoutMs = d.TimeoutMs
				if p.Input == nil {
					args := call.Arguments
					if len(args) == 0 {
						args = json.RawMessage("{}")
					}
					p.Input, _ = json.Marshal(ToolInput{Tool: call.Name, Input: args, ToolCallID: call.ID})
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

// turnRequest is the whole request of an agent turn whose journaled input
// is input: its settings, with the conversation msgs rebuilt from the
// journal. A turn journaled whole (before turns journaled their new
// messages only) gives the same request.
func turnRequest(input json.RawMessage, msgs []provider.Message) (json.RawMessage, error) {
	var in AIInput
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, err
	}
	if in.Prior > len(msgs) || in.Prior+len(in.Messages) != len(msgs) {
		return nil, fmt.Errorf("the turn journals messages %d to %d, the journal rebuilds %d", in.Prior, in.Prior+len(in.Messages), len(msgs))
	}
	in.Messages, in.Prior = msgs, 0
	return json.Marshal(in)
}

// scopeEnv is the environment of one scope: input, and the outputs of the
// completed steps of wf in the loop iterations scope, by node id.
func scopeEnv(st *RunState, wf *workflow.Workflow, scope []Iteration, input any) workflow.Env {
	steps := make(map[string]any, len(wf.Nodes))
	for i := range wf.Nodes {
		n := &wf.Nodes[i]
		if n.Type == workflow.TypeTrigger {
			steps[n.ID] = input
			continue
		}
		if s, ok := st.stepAt(scope, n.ID); ok && s.Status == StepCompleted {
			steps[n.ID] = s.OutputValue()
		}
	}
	return workflow.Env{Input: input, Steps: steps}
}

// stepAt finds the step of node in the loop iterations scope. Next looks
// up every node of every iteration it walks, most of them completed: the
// id is built in a stack buffer, so finding them allocates nothing.
func (st *RunState) stepAt(scope []Iteration, node string) (*Step, bool) {
	if len(scope) == 0 {
		s, ok := st.Steps[node]
		return s, ok
	}
	var buf [96]byte
	s, ok := st.Steps[string(StepID{Loops: scope, Node: node}.appendTo(buf[:0]))]
	return s, ok
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

// gateStep fills the confidence gate of p, an LLM step of node: the gate
// to score it with, the verdict of its journaled score, or (the run's
// policy turns gates off) that it is bypassed.
func gateStep(st *RunState, node *workflow.Node, p *StepPlan) {
	g := node.Confidence()
	if g == nil {
		return
	}
	if st.Workflow.GateOff() {
		s := st.Steps[p.StepID]
		p.GateOff = s == nil || s.BypassedAttempt != p.Attempt
		return
	}
	if !planGate(st, g, p) {
		p.Confidence = g
	}
}
