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
// time now: the first of Frontier's steps (with nothing busy), or what
// Frontier decides instead. It is pure: the same inputs always give the
// same action. now decides only waits: an approval whose deadline is not
// after now has timed out. A waiting run gets the same answer as a
// running one: a RunStep whose Wait says it is still waiting, or the
// step that its new input (a decision, or the passing of its deadline)
// unblocks.
func Next(wf *workflow.Workflow, st *RunState, now time.Time) Action {
	return NextContext(context.Background(), wf, st, now)
}

// NextContext is Next with a context that interrupts the evaluation of
// conditions (a cancelled run, a lost lease frees the worker at once).
// The action it returns after ctx has ended is not to be acted on.
func NextContext(ctx context.Context, wf *workflow.Workflow, st *RunState, now time.Time) Action {
	a := Frontier(ctx, wf, st, now, nil)
	if rs, ok := a.(RunSteps); ok && len(rs.Plans) > 0 {
		// With nothing busy the set is never empty: every step that
		// is not ended is in it, or cut after the first.
		return RunStep{Plan: rs.Plans[0]}
	}
	return a
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

// completedEnds is what a node's completed step means for the run: nil,
// unless the step ends the run (an approval rejected or a wait timed out,
// with no edge routing on it).
func completedEnds(wf *workflow.Workflow, node *workflow.Node, s *Step, id StepID) Action {
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

// scopeEnv is the environment of one scope: input, the outputs of the
// completed steps of wf in the loop iterations scope, by node id, and the
// errors of the failed ones whose nodes continue.
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
	return workflow.Env{Input: input, Steps: steps, Failed: failedSteps(st, wf, scope)}
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
