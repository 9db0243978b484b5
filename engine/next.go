package engine

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// Action is what a run does next. It is one of Done, RunStep, Complete,
// Fail.
type Action interface{ isAction() }

// Done means the run has ended (or is parked): nothing to do.
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

// StepPlan describes a step to execute.
type StepPlan struct {
	StepID   string
	NodeID   string
	NodeType string
	Node     *workflow.Node
	Attempt  int
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
	// Output is set for steps that need no I/O (condition nodes): the
	// worker journals it directly.
	Output json.RawMessage
	// Pure is true when Output is set.
	Pure bool
}

// Next decides the run's next action from its workflow and folded state.
// It is pure: the same inputs always give the same action.
func Next(wf *workflow.Workflow, st *RunState) Action {
	if st.Status.Terminal() || st.Status == StatusWaiting {
		return Done{Status: st.Status}
	}
	if wf == nil {
		msg := "run has no workflow"
		if st.WorkflowErr != nil {
			msg = fmt.Sprintf("workflow snapshot does not parse: %v", st.WorkflowErr)
		}
		return Fail{Code: event.CodeInvalidWorkflow, Error: msg}
	}
	env := runEnv(st, wf)
	resolved := make(map[string]bool, len(wf.Nodes))
	completed := make(map[string]bool, len(wf.Nodes))
nodes:
	for _, id := range wf.Order() {
		node, _ := wf.Node(id)
		if node.Type == workflow.TypeTrigger {
			resolved[id], completed[id] = true, true
			continue
		}
		incoming := wf.Incoming(id)
		fired := false
		for _, e := range incoming {
			if !resolved[e.From] {
				continue nodes // pending: a source has not run yet
			}
			if completed[e.From] && !fired {
				ok, err := wf.EdgeFires(e, env)
				if err != nil {
					return Fail{Code: event.CodeStepFailed, StepID: id, Error: err.Error()}
				}
				fired = ok
			}
		}
		if !fired {
			resolved[id] = true // dead: no incoming edge fired
			continue
		}
		if s, ok := st.Steps[id]; ok {
			switch s.Status {
			case StepCompleted:
				resolved[id], completed[id] = true, true
				continue
			case StepFailed:
				return Fail{Code: event.CodeStepFailed, StepID: id,
					Error: fmt.Sprintf("step %s failed: %s", id, s.Error)}
			}
		}
		return planStep(wf, st, node, env)
	}
	out := st.Created.Input
	if s, ok := st.Steps[st.LastCompleted]; ok {
		out = s.Output
	}
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	return Complete{Output: out}
}

func planStep(wf *workflow.Workflow, st *RunState, node *workflow.Node, env workflow.Env) Action {
	p := StepPlan{StepID: node.ID, NodeID: node.ID, NodeType: node.Type, Node: node, Attempt: 1}
	if s, ok := st.Steps[node.ID]; ok {
		p.Attempt = s.Attempt
		p.Tries = s.Retries
		switch s.Status {
		case StepRunning:
			p.Started = true
			p.Input = s.Input
			p.Claimed, p.Delivered = s.Claimed, s.Delivered
		case StepRetrying:
			p.NotBefore = s.RetryAt
			p.Claimed, p.Delivered = s.Claimed, s.Delivered
		}
		if p.Attempt < 1 {
			p.Attempt = 1
		}
	}
	p.Key = event.IdempotencyKey(st.RunID, p.StepID, p.Attempt)
	if p.Input == nil {
		in, err := RenderInput(node, env)
		if err != nil {
			return Fail{Code: event.CodeStepFailed, StepID: node.ID, Error: fmt.Sprintf("step %s: %v", node.ID, err)}
		}
		p.Input = in
	}
	if node.Type == workflow.TypeCondition {
		d, err := node.Condition()
		if err != nil {
			return Fail{Code: event.CodeInvalidWorkflow, StepID: node.ID, Error: err.Error()}
		}
		v, err := wf.Eval(d.Expression, env)
		if err != nil {
			return Fail{Code: event.CodeStepFailed, StepID: node.ID,
				Error: fmt.Sprintf("step %s: expression %q: %v", node.ID, d.Expression, err)}
		}
		out, err := json.Marshal(map[string]any{"result": v})
		if err != nil {
			return Fail{Code: event.CodeStepFailed, StepID: node.ID, Error: err.Error()}
		}
		p.Output, p.Pure = out, true
	}
	return RunStep{Plan: p}
}

// Env returns the template and condition environment of a run: its input
// and the outputs of its completed steps (the trigger's output is the
// input).
func Env(st *RunState) workflow.Env { return runEnv(st, st.Workflow) }

// runEnv is Env with the trigger taken from wf, the workflow Next was
// given (which may not be the journal's snapshot, when there is none).
func runEnv(st *RunState, wf *workflow.Workflow) workflow.Env {
	steps := make(map[string]any, len(st.Steps)+1)
	for id, s := range st.Steps {
		if s.Status == StepCompleted {
			steps[id] = s.OutputValue()
		}
	}
	if wf != nil {
		if t := wf.Trigger(); t != nil {
			steps[t.ID] = st.Input()
		}
	}
	return workflow.Env{Input: st.Input(), Steps: steps}
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
