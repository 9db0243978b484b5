package engine

import "github.com/palrun/pal/event"

// The fold of the inputs from outside the drive: an approver's decision
// and a signal. (budget_raised, the third, is the brakes': brakes_fold.go.)

// onApprovalReceived keeps the first decision per step, even one that
// comes before the run reaches the step; a decision on an anomaly pause
// is the brakes' (decidePause).
func (st *RunState) onApprovalReceived(ev event.Event, d event.ApprovalReceivedData) error {
	if st.decidePause(ev.StepID, d) {
		return nil
	}
	if _, ok := st.Decisions[ev.StepID]; !ok {
		st.Decisions[ev.StepID] = d
	}
	return nil
}

// onSignalReceived queues the signal under its name, oldest first, until
// a wait step takes it (takeSignal).
func (st *RunState) onSignalReceived(ev event.Event, d event.SignalReceivedData) error {
	if st.Signals == nil {
		st.Signals = map[string][]*Signal{}
	}
	st.Signals[d.Signal] = append(st.Signals[d.Signal], &Signal{Seq: ev.Seq, Payload: d.Payload, By: d.By, At: ev.TS})
	return nil
}
