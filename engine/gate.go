package engine

import (
	"fmt"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// GatePlan is the verdict left to carry out for a gated step whose score
// is journaled (confidence_evaluated): the step's calls are done, and no
// call is made again.
type GatePlan struct {
	Gate *workflow.ConfidenceGate
	event.ConfidenceEvaluatedData
	// Decision is the approver's, for a low score under onLow "approval";
	// nil while none came (the plan's Wait says the step waits).
	Decision *event.ApprovalReceivedData
}

// Verdicts of a GatePlan (Verdict).
const (
	GateComplete = "complete" // the step completes with the journaled output
	GateBypass   = "bypass"   // an approver accepted a low score: bypassed, then complete
	GateFail     = "fail"     // the step fails (class confidence)
	GateRetry    = "retry"    // the step is tried again with its next attempt
)

// Verdict says what the worker does for g.
func (g *GatePlan) Verdict() string {
	if g.Passed {
		return GateComplete
	}
	switch g.Gate.Action() {
	case workflow.OnLowRoute:
		return GateComplete
	case workflow.OnLowRetry:
		return GateRetry
	case workflow.OnLowApproval:
		if g.Decision != nil && g.Decision.Decision == event.DecisionApprove {
			return GateBypass
		}
	}
	return GateFail
}

// LowError is the error a low score fails its step with.
func (g *GatePlan) LowError(stepID string) string {
	msg := fmt.Sprintf("step %s: confidence %.4g (%s) is below the min of %.4g", stepID, g.Score, g.Source, g.Min)
	if d := g.Decision; d != nil {
		msg += "; rejected"
		if d.Approver != "" {
			msg += " by " + d.Approver
		}
		if d.Comment != "" {
			msg += ": " + d.Comment
		}
	}
	return msg
}

// planGate turns p, the plan of an LLM step of a gated node, into the
// plan of its verdict when its current attempt's score is journaled. It
// reports false when there is no score yet: the step makes its call.
func planGate(st *RunState, g *workflow.ConfidenceGate, p *StepPlan) bool {
	s, ok := st.Steps[p.StepID]
	if !ok || s.Status == StepRetrying {
		return false
	}
	c := s.ConfidenceOf()
	if c == nil {
		return false
	}
	p.Gate = &GatePlan{Gate: g, ConfidenceEvaluatedData: c.ConfidenceEvaluatedData}
	if c.Passed || g.Action() != workflow.OnLowApproval {
		return true
	}
	if dec, ok := st.Decisions[p.StepID]; ok {
		p.Gate.Decision = &dec
		return true
	}
	p.Wait = &WaitPlan{Reason: event.WaitApproval, Waiting: s.Status == StepWaiting}
	return true
}

// WaitsOnGate reports whether step stepID of st is parked by its node's
// confidence gate, waiting for an approver to accept or reject its score.
func WaitsOnGate(st *RunState, stepID string) bool {
	s, ok := st.Steps[stepID]
	return ok && s.Status == StepWaiting && s.WaitReason == event.WaitApproval && s.ConfidenceOf() != nil
}

// failCode is the run_failed code for a failed step.
func failCode(s *Step) string {
	if s.Class == event.ClassConfidence {
		return event.CodeLowConfidence
	}
	return event.CodeStepFailed
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
