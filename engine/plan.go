package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

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

// execOf is the executor of the step of each node type planStep plans.
var execOf = map[string]string{workflow.TypeAIStep: ExecLLM, workflow.TypeTool: ExecTool, workflow.TypeConnector: ExecConnector,
	workflow.TypeCondition: ExecPure, workflow.TypeApproval: ExecApproval, workflow.TypeSubagent: ExecSubagent,
	workflow.TypeProcess: ExecProcess, workflow.TypeWait: ExecWait}

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
	// Pure is true when Output is set, or when Error is: a pure step that
	// fails.
	Pure bool
	// Error and Class are set on a pure step that fails (an agent whose
	// turn failed, when its node continues past failures): the worker
	// journals step_failed with them instead of step_completed.
	Error string
	Class string
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
	// Fallback is the index of the model this attempt of an LLM step
	// calls in its node's model list; Models how many the list has (1 for
	// one model, 0 for steps that call none). Tries counts the tries on
	// that model.
	Fallback, Models int
}

// Call is the input the executor runs the step with: Request when set,
// else Input.
func (p StepPlan) Call() json.RawMessage {
	if p.Request != nil {
		return p.Request
	}
	return p.Input
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

// fallbackOf is the index of the model step sid's current attempt calls in
// its node's model list.
func fallbackOf(st *RunState, sid string) int {
	if s, ok := st.Steps[sid]; ok {
		return s.Fallback
	}
	return 0
}

// basePlan fills the attempt, key and resume state of step sid.
func basePlan(st *RunState, node *workflow.Node, sid, exec string) StepPlan {
	p := StepPlan{StepID: sid, NodeID: node.ID, NodeType: node.Type, Node: node, Exec: exec, Attempt: 1}
	if s, ok := st.Steps[sid]; ok {
		p.Attempt = max(s.Attempt, 1)
		p.Tries, p.Fallback = s.ModelRetries, s.Fallback
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

// planStep plans the step sid of node, a node that is one step (a loop
// and an agent plan their own steps: loop.go, agent.go): its rendered
// input, then what its type adds.
func planStep(ctx context.Context, wf *workflow.Workflow, st *RunState, node *workflow.Node, sid string, env workflow.Env, now time.Time) Action {
	p := basePlan(st, node, sid, execOf[node.Type])
	if p.Input == nil {
		in, err := renderInput(node, env, p.Fallback)
		if err != nil {
			return stepFailed(sid, "%v", err)
		}
		p.Input = in
	}
	switch node.Type {
	case workflow.TypeAIStep:
		p.TimeoutMs = nodeTimeout(node)
		if d, err := node.AIStep(); err == nil {
			p.Models = len(d.Model.Choices(d.Provider))
		}
		gateStep(st, node, &p)
	case workflow.TypeTool, workflow.TypeConnector:
		p.TimeoutMs = nodeTimeout(node)
	case workflow.TypeProcess:
		return planProcess(st, node, p)
	case workflow.TypeCondition:
		return planCondition(ctx, wf, node, p, env)
	case workflow.TypeApproval:
		return planApproval(st, node, p, now)
	case workflow.TypeWait:
		return planWait(st, node, p, now)
	case workflow.TypeSubagent:
		return planSubagent(st, p)
	}
	return RunStep{Plan: p}
}

// stepFailed fails the run at step sid for a reason of the step's own (a
// template that does not render, an expression that does not evaluate).
func stepFailed(sid, format string, args ...any) Fail {
	return Fail{Code: event.CodeStepFailed, StepID: sid, Error: fmt.Sprintf("step %s: ", sid) + fmt.Sprintf(format, args...)}
}

// invalidNode fails the run at step sid for node data that does not
// decode.
func invalidNode(sid string, err error) Fail {
	return Fail{Code: event.CodeInvalidWorkflow, StepID: sid, Error: err.Error()}
}

// pure makes p a step that needs no I/O: it completes with out.
func pure(p StepPlan, out json.RawMessage) Action {
	p.Output, p.Pure = out, true
	return RunStep{Plan: p}
}

// planProcess gives up on a process step whose processes keep not
// finishing: more re-drives than its maxResumes.
func planProcess(st *RunState, node *workflow.Node, p StepPlan) Action {
	d, err := node.Process()
	if err != nil {
		return invalidNode(p.StepID, err)
	}
	p.TimeoutMs = d.TimeoutMs
	if s, ok := st.Steps[p.StepID]; ok && p.Started {
		p.Resumes = s.Resumes
	}
	if p.Resumes > d.Resumes() {
		return Fail{Code: event.CodeProcessResumeExhausted, StepID: p.StepID, Attempts: p.Resumes,
			Error: fmt.Sprintf("step %s: %d processes started for it did not finish, over its maxResumes of %d re-drives; giving up",
				p.StepID, p.Resumes, d.Resumes())}
	}
	return RunStep{Plan: p}
}

// planCondition evaluates a condition node: a pure step.
func planCondition(ctx context.Context, wf *workflow.Workflow, node *workflow.Node, p StepPlan, env workflow.Env) Action {
	d, err := node.Condition()
	if err != nil {
		return invalidNode(p.StepID, err)
	}
	v, err := wf.EvalContext(ctx, d.Expression, env)
	if err != nil {
		return stepFailed(p.StepID, "expression %q: %v", d.Expression, err)
	}
	out, err := json.Marshal(ConditionOutput{Result: v})
	if err != nil {
		return stepFailed(p.StepID, "%v", err)
	}
	return pure(p, out)
}

// planApproval completes an approval step with its decision, or waits for
// one until its deadline.
func planApproval(st *RunState, node *workflow.Node, p StepPlan, now time.Time) Action {
	d, err := node.Approval()
	if err != nil {
		return invalidNode(p.StepID, err)
	}
	if dec, ok := st.Decisions[p.StepID]; ok {
		out, _ := json.Marshal(event.ApprovalOutput{Approved: dec.Decision == event.DecisionApprove,
			Decision: dec.Decision, Approver: dec.Approver, Comment: dec.Comment})
		return pure(p, out)
	}
	return waitFor(st, p, WaitPlan{Reason: event.WaitApproval, TimeoutMs: d.TimeoutMs}, now,
		event.ApprovalOutput{Decision: event.DecisionTimeout, TimedOut: true})
}

// planWait completes a wait step with the oldest signal of its name not
// yet taken, even one sent before the run got here, or waits for one
// until its deadline.
func planWait(st *RunState, node *workflow.Node, p StepPlan, now time.Time) Action {
	d, err := node.Wait()
	if err != nil {
		return invalidNode(p.StepID, err)
	}
	if sg := st.PendingSignal(d.Signal); sg != nil {
		out := sg.Payload
		if len(out) == 0 {
			out = json.RawMessage("null")
		}
		p.SignalSeq = sg.Seq
		return pure(p, out)
	}
	return waitFor(st, p, WaitPlan{Reason: event.WaitSignal, Signal: d.Signal, TimeoutMs: d.TimeoutMs}, now,
		event.SignalTimeoutOutput{Signal: d.Signal, TimedOut: true})
}

// waitFor plans p as the wait w: the journaled one, with its deadline,
// or a new one whose deadline is now plus w.TimeoutMs. A wait whose
// deadline has passed is no wait: the step completes with timedOut,
// which routes along an edge on timed_out or fails the run.
func waitFor(st *RunState, p StepPlan, w WaitPlan, now time.Time, timedOut any) Action {
	if s, ok := st.Steps[p.StepID]; ok && s.Status == StepWaiting {
		w.Waiting, w.TimeoutAt = true, s.TimeoutAt
	} else if w.TimeoutMs > 0 {
		w.TimeoutAt = now.Add(time.Duration(w.TimeoutMs) * time.Millisecond).UTC()
	}
	if w.Waiting && !w.TimeoutAt.IsZero() && !now.Before(w.TimeoutAt) {
		out, _ := json.Marshal(timedOut)
		return pure(p, out)
	}
	p.Wait = &w
	return RunStep{Plan: p}
}

// planSubagent names the child run of a subagent step, unless it would
// nest deeper than MaxDepth.
func planSubagent(st *RunState, p StepPlan) Action {
	depth := st.Created.Depth + 1
	if depth > MaxDepth {
		return Fail{Code: event.CodeDepthExceeded, StepID: p.StepID, Error: fmt.Sprintf(
			"step %s would start a subagent at depth %d, over the limit of %d (chain: %s)", p.StepID, depth, MaxDepth, chainString(st))}
	}
	p.ChildRunID = event.ChildRunID(st.RunID, p.StepID)
	return RunStep{Plan: p}
}

func nodeTimeout(node *workflow.Node) int {
	var d struct {
		TimeoutMs int `json:"timeoutMs"`
	}
	_ = json.Unmarshal(node.Data, &d)
	return d.TimeoutMs
}
