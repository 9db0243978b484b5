package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Version is the envelope version written in the "v" field.
const Version = 1

// Kind names an event type.
type Kind string

// Event kinds. New kinds are added to schemas/event.schema.json first.
const (
	RunCreated             Kind = "run_created"
	RunResumed             Kind = "run_resumed"
	StepStarted            Kind = "step_started"
	StepCompleted          Kind = "step_completed"
	StepFailed             Kind = "step_failed"
	StepRetrying           Kind = "step_retrying"
	StepWaiting            Kind = "step_waiting"
	SideEffectClaimed      Kind = "side_effect_claimed"
	SideEffectDelivered    Kind = "side_effect_delivered"
	ChildRunCreated        Kind = "child_run_created"
	AnomalyDetected        Kind = "anomaly_detected"
	ConfidenceEvaluated    Kind = "confidence_evaluated"
	ConfidenceGateBypassed Kind = "confidence_gate_bypassed"
	RunSucceeded           Kind = "run_succeeded"
	RunFailed              Kind = "run_failed"
	RunCancelled           Kind = "run_cancelled"
	// ApprovalReceived records a decision on an approval step. It is an
	// input from outside the run: any writer may append it, fenced.
	ApprovalReceived Kind = "approval_received"
	// SignalReceived records a named signal sent to a run. It is an
	// input like approval_received: kept until a wait node takes it.
	SignalReceived Kind = "signal_received"

	// Process step reports (the process tier): a child process run by a
	// process node reports its own sub-steps; the driving worker journals
	// them, fenced like every append of its drive.
	SubstepStarted   Kind = "substep_started"
	SubstepCompleted Kind = "substep_completed"
)

// Budget kinds (docs/architecture.md §7.8). BudgetRaised is an input
// from outside the run, like ApprovalReceived.
const (
	BudgetWarning  Kind = "budget_warning"
	BudgetExceeded Kind = "budget_exceeded"
	BudgetRaised   Kind = "budget_raised"
)

// Kinds lists every kind in a stable order.
var Kinds = []Kind{
	RunCreated, RunResumed, StepStarted, StepCompleted, StepFailed, StepRetrying,
	StepWaiting, SideEffectClaimed, SideEffectDelivered, ChildRunCreated,
	AnomalyDetected, ConfidenceEvaluated, ConfidenceGateBypassed,
	RunSucceeded, RunFailed, RunCancelled, ApprovalReceived,
	SubstepStarted, SubstepCompleted,
	BudgetWarning, BudgetExceeded, BudgetRaised,
	SignalReceived,
}

// Terminal reports whether k ends a run.
func (k Kind) Terminal() bool {
	return k == RunSucceeded || k == RunFailed || k == RunCancelled
}

// Input reports whether k is an input from outside the run rather than
// the driving worker's own record: such events may land while a worker
// drives the run without taking the run from it.
func (k Kind) Input() bool { return k == ApprovalReceived || k == BudgetRaised || k == SignalReceived }

// Driven reports whether only the worker driving the run (the writer of
// its latest run_resumed) may append k: every kind but run_created (the
// first, by the starter or a parent's drive), run_resumed (which opens a
// drive) and the kinds any writer may append (approval_received,
// budget_raised, signal_received, run_cancelled).
func (k Kind) Driven() bool {
	switch k {
	case RunCreated, RunResumed, RunCancelled, ApprovalReceived, BudgetRaised, SignalReceived:
		return false
	}
	return true
}

// Known reports whether k is one of Kinds.
func (k Kind) Known() bool {
	for _, x := range Kinds {
		if x == k {
			return true
		}
	}
	return false
}

// Event is the journal envelope.
type Event struct {
	V        int       `json:"v"`
	RunID    string    `json:"run_id"`
	Seq      uint64    `json:"seq"`
	Kind     Kind      `json:"kind"`
	TS       time.Time `json:"ts"`
	StepID   string    `json:"step_id,omitempty"`
	Attempt  int       `json:"attempt,omitempty"`
	WorkerID string    `json:"worker_id"`
	TraceID  string    `json:"trace_id,omitempty"`
	// Prev is the hex sha256 (Hash) of the exact bytes of the previous
	// message on the run's subject; "" on the first. Every event of a
	// packed message carries the same Prev. The writer (the event store's
	// Append) fills it in.
	Prev string          `json:"prev,omitempty"`
	Data json.RawMessage `json:"data"`
}

// New builds an event of kind k whose data is payload marshalled to JSON.
// RunID, Seq and TS are filled in by the writer.
func New(k Kind, stepID string, attempt int, payload any) (Event, error) {
	data, err := json.Marshal(payload)
	if err != nil {
		return Event{}, fmt.Errorf("encoding %s payload: %w", k, err)
	}
	if bytes.Equal(data, []byte("null")) {
		data = []byte("{}")
	}
	return Event{V: Version, Kind: k, StepID: stepID, Attempt: attempt, Data: data}, nil
}

// MustNew is New for payload types that always marshal (the structs in this
// package). It panics only on a programming error.
func MustNew(k Kind, stepID string, attempt int, payload any) Event {
	ev, err := New(k, stepID, attempt, payload)
	if err != nil {
		panic(err)
	}
	return ev
}

// DecodeData unmarshals the event's data into v.
func (e Event) DecodeData(v any) error {
	if len(e.Data) == 0 {
		return nil
	}
	if err := json.Unmarshal(e.Data, v); err != nil {
		return fmt.Errorf("decoding %s data of run %s seq %d: %w", e.Kind, e.RunID, e.Seq, err)
	}
	return nil
}

// ErrMalformed is returned by Decode for a message that is not an envelope or
// an array of envelopes.
var ErrMalformed = errors.New("malformed event message")

// Encode marshals events into one message body: an object for one event, an
// array for several (strict-mode packing).
func Encode(evs ...Event) ([]byte, error) {
	switch len(evs) {
	case 0:
		return nil, errors.New("encoding events: nothing to encode")
	case 1:
		return json.Marshal(evs[0])
	default:
		return json.Marshal(evs)
	}
}

// Decode parses a message body into its events, checking the envelope
// fields every reader relies on.
func Decode(body []byte) ([]Event, error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, fmt.Errorf("%w: empty body", ErrMalformed)
	}
	var evs []Event
	if body[0] == '[' {
		if err := json.Unmarshal(body, &evs); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		if len(evs) == 0 {
			return nil, fmt.Errorf("%w: empty batch", ErrMalformed)
		}
	} else {
		var ev Event
		if err := json.Unmarshal(body, &ev); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		evs = []Event{ev}
	}
	for i, ev := range evs {
		switch {
		case ev.V != Version:
			return nil, fmt.Errorf("%w: unsupported version %d", ErrMalformed, ev.V)
		case ev.RunID == "":
			return nil, fmt.Errorf("%w: missing run_id", ErrMalformed)
		case ev.Seq == 0:
			return nil, fmt.Errorf("%w: missing seq", ErrMalformed)
		case ev.Kind == "":
			return nil, fmt.Errorf("%w: missing kind", ErrMalformed)
		case i > 0 && (ev.RunID != evs[0].RunID || ev.Seq != evs[i-1].Seq+1):
			return nil, fmt.Errorf("%w: batch is not consecutive events of one run", ErrMalformed)
		}
	}
	return evs, nil
}
