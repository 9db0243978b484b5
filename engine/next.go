package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
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
		rs.Plan = st.capOutput(rs.Plan)
		if b := st.brakesAt(rs.Plan, now); b != nil {
			return b
		}
		return rs
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
		if s, ok := st.stepAt(scope, id); ok && (s.Status == StepCompleted || s.Status == StepFailed) {
			if f := ended(wf, node, s, stepID); f != nil {
				return f, nil
			}
			state[idx] = isCompleted
			if last == nil || s.CompletedSeq > last.CompletedSeq {
				last = s
			}
			continue
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

// ended is what a node's step that has ended means for the walk: nil
// for a completed step, which resolves its node, unless the step ends the
// run (an approval rejected or a wait timed out, with no edge routing on
// it); a failed step fails the run.
func ended(wf *workflow.Workflow, node *workflow.Node, s *Step, id StepID) Action {
	if s.Status == StepFailed {
		sid := id.String()
		return Fail{Code: failCode(s), StepID: sid, Error: fmt.Sprintf("step %s failed: %s", sid, s.Error)}
	}
	// Most steps are neither: their ids are not built (a loop's walk
	// meets every completed step of its iteration).
	if node.Type != workflow.TypeApproval && node.Type != workflow.TypeWait || wf.ConditionalRouting(node.ID) {
		return nil
	}
	sid := id.String()
	if node.Type == workflow.TypeApproval {
		if f, failed := rejected(s, sid); failed {
			return f
		}
		return nil
	}
	if waitTimedOut(s) {
		return Fail{Code: CodeSignalTimeout, StepID: sid, Error: fmt.Sprintf("step %s timed out waiting for a signal", sid)}
	}
	return nil
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
