package engine

import (
	"encoding/json"

	"github.com/palrun/pal/event"
)

// Action is what a run does next: the sum of the types in this file. Next
// and Frontier return one, and the worker carries it out.
type Action interface{ isAction() }

// Done means the run has ended: nothing to do.
type Done struct{ Status Status }

// RunStep asks the worker to execute (or resume) one step.
type RunStep struct{ Plan StepPlan }

// RunSteps asks the worker to execute (or resume) every step of Plans
// at once, as it would each one's RunStep: the run's frontier, in a
// deterministic order (Frontier). Plans is empty when every step that
// may go on is in flight in the caller's drive: wait for one to end, then
// ask again.
type RunSteps struct{ Plans []StepPlan }

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

// Note asks the worker to journal one of the brakes' events
// (budget_warning, budget_exceeded, anomaly_detected) and ask Next again.
type Note struct {
	Kind   event.Kind
	StepID string
	Data   any
}

// Park asks the worker to park the run on a brake: step_waiting with
// Reason (budget or anomaly) on StepID, unless Waiting says that is
// journaled already. A budget wait ends with budget_raised, an anomaly
// wait with approval_received for StepID (or a cancel).
type Park struct {
	Reason  string
	StepID  string
	Waiting bool
}

func (Done) isAction()     {}
func (RunStep) isAction()  {}
func (RunSteps) isAction() {}
func (Complete) isAction() {}
func (Fail) isAction()     {}
func (Note) isAction()     {}
func (Park) isAction()     {}
