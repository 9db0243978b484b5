package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// Frontier decides what the run does next at time now, as Next does, but
// where Next gives one step Frontier gives every step that may go on now:
// RunSteps, the run's frontier. It is pure: the same inputs always give
// the same action. Its contract:
//
//   - The steps are in a deterministic order: the walk's, topological with
//     ties in declaration order, a loop's iterations by index, an agent
//     turn's tool calls in the model's order. Next is its first step.
//   - A node runs when every source of its incoming edges is resolved and
//     at least one incoming edge fired: a node with several incoming edges
//     (a join) waits until every source is resolved.
//   - busy names the steps in flight in the caller's drive (started, their
//     outcome not journaled yet): they are never returned, and their nodes
//     are not resolved. A step started by an earlier drive and not ended
//     (not busy) is returned with Started set: the drive that resumes the
//     run sends it again with the same attempt and idempotency key.
//   - RunSteps is empty only when every step that may go on is busy: the
//     caller waits for one to end and asks again.
//   - A step that fails the run gives Fail at once, whatever else is ready
//     or busy: the caller interrupts what it has in flight. A step of a
//     node with onFailure "continue" resolves its node instead.
//   - The brakes look at the whole set before it is dispatched
//     (brakesFor): the worst cases of the LLM steps in flight and of the
//     steps ahead in the set are reserved together, so steps dispatched
//     together never overshoot a budget; a step that does not fit cuts the
//     set, and is noted (budget_exceeded) only once nothing is in flight.
//
// The caller decides how many of the steps to start (a run's concurrency
// limit is the worker's business, not the journal's): it starts them in
// order, so the reservations hold for the ones it starts.
func Frontier(ctx context.Context, wf *workflow.Workflow, st *RunState, now time.Time, busy map[string]bool) Action {
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
		env = workflow.Env{Input: st.Input(), Steps: st.outputs, Failed: failedSteps(st, wf, nil)}
	} else {
		env = scopeEnv(st, wf, nil, st.Input())
	}
	f := &frontier{ctx: ctx, st: st, now: now, busy: busy}
	if wf == st.Workflow {
		f.memo = st.settledOf(wf)
	}
	out, resolved := f.walk(wf, nil, env)
	switch {
	case f.stop != nil:
		return f.stop
	case f.interrupted != nil:
		return f.interrupted
	case resolved:
		return Complete{Output: out}
	}
	for i, p := range f.plans {
		// A step a fork copies is not executed, so no brake applies to it.
		if c, ok := copied(st, p); ok {
			f.plans[i] = c
		}
	}
	return st.brakesFor(f.plans, f.flying, now)
}

// frontier is one walk of the run's graph: what it found ready (plans),
// in flight in the caller's drive (flying), and what stops the run.
type frontier struct {
	ctx  context.Context
	st   *RunState
	now  time.Time
	busy map[string]bool

	plans  []StepPlan
	flying []StepPlan
	// stop is the first action other than a step the walk met (a Fail):
	// it ends the walk.
	stop Action
	// interrupted fails the run at a step that was interrupted when a
	// step beside it failed the run: the journal shows that failure too,
	// unless the drive that journaled it died before run_failed landed,
	// so it is the answer only when the walk finds no other.
	interrupted Action
	// memo is the run's settled prefix of its top-level graph (nil when
	// the walk is not of the run's own workflow): the walk starts past it
	// and extends it.
	memo *settled
}

// add takes what planning one step gave: a step, or what stops the run.
func (f *frontier) add(a Action) {
	switch a := a.(type) {
	case RunStep:
		if f.busy[a.Plan.StepID] {
			f.flying = append(f.flying, a.Plan)
			return
		}
		f.plans = append(f.plans, a.Plan)
	default:
		if f.stop == nil {
			f.stop = a
		}
	}
}

// How one walk sees a node.
const (
	// pending: a source is not resolved, or its step has not ended.
	pending uint8 = iota
	// dead: no incoming edge fired.
	dead
	// resolved: its step completed (or failed, and the node continues).
	resolved
)

// walk walks one graph: the run's workflow (scope nil) or one iteration
// of a loop body (scope each[3]) in its environment env, adding what is
// ready to f. It reports whether every node is resolved, and then the
// scope's output: that of its last completed step, or its input when
// nothing ran.
func (f *frontier) walk(wf *workflow.Workflow, scope []Iteration, env workflow.Env) (json.RawMessage, bool) {
	state := make([]uint8, len(wf.Nodes))
	done := true
	var last *Step
	order, from := wf.OrderIndexes(), 0
	memo := f.memo
	if scope != nil {
		memo = nil
	}
	if memo != nil {
		copy(state, memo.state)
		from = memo.n
		last = f.st.Steps[memo.last]
	}
	for k := from; k < len(order); k++ {
		idx := order[k]
		s, seen := f.visit(wf, idx, scope, env, state)
		state[idx] = seen
		if f.stop != nil {
			return nil, false
		}
		if seen == pending {
			done = false
			memo = nil // the settled prefix ends here
			continue
		}
		if s != nil && s.Status == StepCompleted && (last == nil || s.CompletedSeq > last.CompletedSeq) {
			last = s
		}
		if memo != nil {
			memo.settle(k, idx, seen, last)
		}
	}
	if !done {
		return nil, false
	}
	if last != nil && len(last.Output) > 0 {
		return last.Output, true
	}
	out, err := json.Marshal(env.Input)
	if err != nil || len(out) == 0 {
		out = json.RawMessage("null")
	}
	return out, true
}

// visit decides one node of a walk from the states of the nodes before
// it: pending, dead or resolved (with its ended step), planning its step
// when it is ready.
func (f *frontier) visit(wf *workflow.Workflow, idx int, scope []Iteration, env workflow.Env, state []uint8) (*Step, uint8) {
	node := &wf.Nodes[idx]
	if node.Type == workflow.TypeTrigger {
		return nil, resolved
	}
	id := StepID{Loops: scope, Node: node.ID}
	fired := false
	edges, sources := wf.IncomingAt(idx)
	for i, e := range edges {
		from := state[sources[i]]
		if from == pending {
			return nil, pending
		}
		if from == resolved && !fired {
			ok, err := wf.EdgeFiresContext(f.ctx, e, env)
			if err != nil {
				f.add(Fail{Code: event.CodeStepFailed, StepID: id.String(), Error: err.Error()})
				return nil, pending
			}
			fired = ok
		}
	}
	if !fired {
		return nil, dead
	}
	if s, ok := f.st.stepAt(scope, node.ID); ok && (s.Status == StepCompleted || s.Status == StepFailed) {
		return s, f.ended(wf, node, s, id)
	}
	switch node.Type {
	case workflow.TypeLoop:
		f.planLoop(wf, node, id, env)
	case workflow.TypeAgent:
		f.planAgent(node, id, env)
	default:
		f.add(planStep(f.ctx, wf, f.st, node, id.String(), env, f.now))
	}
	return nil, pending
}

// ended is how a node whose step has ended resolves: a completed step
// resolves it, unless it ends the run (an approval rejected, a wait timed
// out, with no edge routing on it); a failed step fails the run, unless
// the node continues past failures.
func (f *frontier) ended(wf *workflow.Workflow, node *workflow.Node, s *Step, id StepID) uint8 {
	if s.Status == StepFailed {
		if node.Continues() {
			return resolved
		}
		sid := id.String()
		fail := Fail{Code: failCode(s), StepID: sid, Error: fmt.Sprintf("step %s failed: %s", sid, s.Error)}
		if s.Class == event.ClassInterrupted {
			if f.interrupted == nil {
				f.interrupted = fail
			}
			return pending
		}
		f.add(fail)
		return pending
	}
	if a := completedEnds(wf, node, s, id); a != nil {
		f.add(a)
		return pending
	}
	return resolved
}

// failedSteps maps the nodes of wf whose steps in the loop iterations
// scope failed, and which continue past failures, to their errors: what
// conditions read as steps.<id>.status and steps.<id>.error. nil when
// there are none.
func failedSteps(st *RunState, wf *workflow.Workflow, scope []Iteration) map[string]string {
	var out map[string]string
	for i := range wf.Nodes {
		n := &wf.Nodes[i]
		if !n.Continues() {
			continue
		}
		if s, ok := st.stepAt(scope, n.ID); ok && s.Status == StepFailed {
			if out == nil {
				out = map[string]string{}
			}
			out[n.ID] = s.Error
		}
	}
	return out
}
