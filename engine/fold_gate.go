package engine

import "github.com/palrun/pal/event"

// The fold of the confidence gates (gate.go plans their verdicts).

// onConfidenceEvaluated records an attempt's score. A score describes an
// attempt that started; one of no step is only recorded.
func (st *RunState) onConfidenceEvaluated(ev event.Event, d event.ConfidenceEvaluatedData) error {
	if s, ok := st.Steps[ev.StepID]; ok {
		s.Confidence = &Confidence{Attempt: ev.Attempt, ConfidenceEvaluatedData: d}
	}
	return nil
}

// onGateBypassed records the attempt whose gate was bypassed; its data
// (who, why) is for people and is not decoded.
func (st *RunState) onGateBypassed(ev event.Event) error {
	if s, ok := st.Steps[ev.StepID]; ok {
		s.BypassedAttempt = ev.Attempt
	}
	return nil
}
