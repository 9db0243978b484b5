package engine

import "github.com/palrun/pal/event"

// The fold of what a step does beside its outcome: a delivery's claim and
// receipt, the child run it created, the sub-steps its process reported.

func (st *RunState) onSideEffectClaimed(ev event.Event, d event.SideEffectClaimedData) error {
	s := st.step(ev.StepID)
	if ev.Attempt == s.Attempt {
		s.Claimed = true
	}
	a := s.attempt(ev.Attempt, ev.Seq)
	a.Claimed, a.Connector, a.Target = true, d.Connector, d.Target
	if a.ClaimedAt.IsZero() {
		a.ClaimedAt = ev.TS
	}
	return nil
}

func (st *RunState) onSideEffectDelivered(ev event.Event, d event.SideEffectDeliveredData) error {
	s := st.step(ev.StepID)
	if ev.Attempt == s.Attempt {
		s.Delivered = true
		s.DeliveryStatus = d.Status
	}
	a := s.attempt(ev.Attempt, ev.Seq)
	a.Delivered, a.DeliveryStatus, a.DeliveredAt = true, d.Status, ev.TS
	return nil
}

func (st *RunState) onChildRunCreated(ev event.Event, d event.ChildRunCreatedData) error {
	st.step(ev.StepID).ChildRunID = d.ChildRunID
	return nil
}

func (st *RunState) onSubstepStarted(ev event.Event, d event.SubstepStartedData) error {
	a := st.step(ev.StepID).attempt(max(ev.Attempt, 1), ev.Seq)
	if a.Substep(d.Name) == nil {
		a.Substeps = append(a.Substeps, Substep{Name: d.Name, Status: StepRunning})
	}
	return nil
}

func (st *RunState) onSubstepCompleted(ev event.Event, d event.SubstepCompletedData) error {
	a := st.step(ev.StepID).attempt(max(ev.Attempt, 1), ev.Seq)
	sub := a.Substep(d.Name)
	if sub == nil {
		a.Substeps = append(a.Substeps, Substep{Name: d.Name})
		sub = &a.Substeps[len(a.Substeps)-1]
	}
	if sub.Status != StepCompleted {
		sub.Status, sub.Output = StepCompleted, d.Output
	}
	return nil
}
