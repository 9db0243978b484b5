package engine

import (
	"errors"
	"fmt"

	"github.com/palrun/pal/event"
)

// folds holds the fold of each event kind: one handler per kind, as
// go-workflows' executor dispatches history events. The handlers live
// by group: the run's life (fold_run.go), its steps (fold_step.go), what
// a step did beside its outcome (fold_effect.go), the inputs
// (fold_input.go), the confidence gates (fold_gate.go) and the brakes
// (brakes_fold.go). A kind with no entry does not fold
// (TestEveryKindFolds).
var folds = map[event.Kind]func(*RunState, event.Event) error{
	event.RunCreated:             on((*RunState).onRunCreated),
	event.RunResumed:             on((*RunState).onRunResumed),
	event.RunSucceeded:           on((*RunState).onRunSucceeded),
	event.RunFailed:              on((*RunState).onRunFailed),
	event.RunCancelled:           on((*RunState).onRunCancelled),
	event.StepStarted:            on((*RunState).onStepStarted),
	event.StepCompleted:          on((*RunState).onStepCompleted),
	event.StepFailed:             on((*RunState).onStepFailed),
	event.StepRetrying:           on((*RunState).onStepRetrying),
	event.StepWaiting:            on((*RunState).onStepWaiting),
	event.SideEffectClaimed:      on((*RunState).onSideEffectClaimed),
	event.SideEffectDelivered:    on((*RunState).onSideEffectDelivered),
	event.ChildRunCreated:        on((*RunState).onChildRunCreated),
	event.SubstepStarted:         on((*RunState).onSubstepStarted),
	event.SubstepCompleted:       on((*RunState).onSubstepCompleted),
	event.ApprovalReceived:       on((*RunState).onApprovalReceived),
	event.SignalReceived:         on((*RunState).onSignalReceived),
	event.ConfidenceEvaluated:    on((*RunState).onConfidenceEvaluated),
	event.ConfidenceGateBypassed: (*RunState).onGateBypassed,
	event.AnomalyDetected:        on((*RunState).onAnomalyDetected),
	event.BudgetWarning:          on((*RunState).onBudgetWarning),
	event.BudgetExceeded:         on((*RunState).onBudgetExceeded),
	event.BudgetRaised:           on((*RunState).onBudgetRaised),
}

// on makes the table's entry of a handler of payload type T: it decodes
// the event's data, then hands it to h.
func on[T any](h func(*RunState, event.Event, T) error) func(*RunState, event.Event) error {
	return func(st *RunState, ev event.Event) error {
		var d T
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		return h(st, ev, d)
	}
}

// Fold replays events into a fresh state. It fails on a malformed history:
// a gap in seq, a first event other than run_created, a second
// run_created, or data that does not decode.
func Fold(evs []event.Event) (*RunState, error) {
	st := &RunState{}
	for _, ev := range evs {
		if err := st.Apply(ev); err != nil {
			return st, err
		}
	}
	return st, nil
}

// Apply folds one more event into st.
func (st *RunState) Apply(ev event.Event) error {
	if ev.Seq != st.LastSeq+1 {
		return fmt.Errorf("run %s: event seq %d after %d: journal is not gapless", ev.RunID, ev.Seq, st.LastSeq)
	}
	if st.LastSeq == 0 {
		if ev.Kind != event.RunCreated {
			return fmt.Errorf("run %s: first event is %s, want run_created", ev.RunID, ev.Kind)
		}
		st.RunID = ev.RunID
		st.Steps = map[string]*Step{}
		st.Decisions = map[string]event.ApprovalReceivedData{}
	} else if ev.RunID != st.RunID {
		return fmt.Errorf("run %s: event of run %s in its journal", st.RunID, ev.RunID)
	}
	if st.Status.Terminal() {
		return fmt.Errorf("run %s: %s at seq %d after the run ended", st.RunID, ev.Kind, ev.Seq)
	}
	fold, ok := folds[ev.Kind]
	if !ok {
		return fmt.Errorf("run %s: unknown event kind %q at seq %d", ev.RunID, ev.Kind, ev.Seq)
	}
	if err := fold(st, ev); err != nil {
		return err
	}
	if len(st.loops) > 0 && ev.StepID != "" {
		st.forget(ev.Kind, ev.StepID)
	}
	if ev.StepID != "" {
		st.forgetSettled(ev.StepID)
	}
	st.LastSeq = ev.Seq
	st.UpdatedAt = ev.TS
	return nil
}

// FoldCorrupt folds a journal that does not verify: evs, the sound events
// before the bad message, then Corrupt.
func FoldCorrupt(evs []event.Event, cerr *event.CorruptError) (*RunState, error) {
	st, err := Fold(evs)
	if err != nil {
		return st, err
	}
	return st, st.Corrupt(cerr)
}

// Corrupt fails st, the fold of the sound events before a journal's bad
// message, with code journal_corrupt, as the seal (cerr.Seal) a worker
// appends will, so a reader shows the same before and after the seal is
// written. A run that had ended before the bad message keeps its end:
// nothing after a terminal event changes a run. A journal whose very first
// message is bad gives a failed run with nothing else known.
func (st *RunState) Corrupt(cerr *event.CorruptError) error {
	if st.Status.Terminal() {
		return nil
	}
	seal := cerr.Seal()
	if st.LastSeq == 0 {
		var d event.RunFailedData
		_ = seal.DecodeData(&d)
		st.RunID, st.Status, st.Error, st.ErrorCode = cerr.RunID, StatusFailed, d.Error, d.Code
		st.Steps, st.Decisions = map[string]*Step{}, map[string]event.ApprovalReceivedData{}
		return nil
	}
	seal.TS = st.UpdatedAt // no clock here: the time of the last sound event
	if err := st.Apply(seal); err != nil {
		return fmt.Errorf("failing run %s for its corrupt journal: %w", cerr.RunID, err)
	}
	return nil
}

// ErrUnfoldable is matched by FoldRead's error for events that verify but
// do not fold (a bug, a hand-written event): reading again gives the same
// events, so the error is permanent.
var ErrUnfoldable = errors.New("the journal does not fold")

// FoldRead folds what a reader got from a run's journal: its events and
// the read's error. A journal that does not verify (*event.CorruptError)
// folds with FoldCorrupt, so every reader — a worker, the projector,
// runs.Client.Get — sees the run failed with code journal_corrupt; events
// that do not fold return an error matching ErrUnfoldable; any other read
// error is returned as it is.
func FoldRead(evs []event.Event, readErr error) (*RunState, error) {
	var cerr *event.CorruptError
	var st *RunState
	var err error
	switch {
	case errors.As(readErr, &cerr):
		st, err = FoldCorrupt(evs, cerr)
	case readErr != nil:
		return nil, readErr
	default:
		st, err = Fold(evs)
	}
	if err != nil {
		return st, fmt.Errorf("%w: %w", ErrUnfoldable, err)
	}
	return st, nil
}
