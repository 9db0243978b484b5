package engine

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// Status is a run's status (the runs.status column).
type Status string

// Run statuses.
const (
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusWaiting   Status = "waiting"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
)

// Terminal reports whether s is final.
func (s Status) Terminal() bool {
	return s == StatusSucceeded || s == StatusFailed || s == StatusCancelled
}

// StepStatus is a step's status.
type StepStatus string

// Step statuses.
const (
	StepRunning   StepStatus = "running"
	StepRetrying  StepStatus = "retrying"
	StepCompleted StepStatus = "completed"
	StepFailed    StepStatus = "failed"
	StepWaiting   StepStatus = "waiting"
)

// StepRetried is the status of an attempt that failed and was followed by
// a journaled retry.
const StepRetried StepStatus = "retried"

// Attempt is the folded state of one attempt of a step: the unit of the
// steps table and of the waterfall. A retry whose outcome was unknown keeps
// its attempt (and key), so one Attempt may span several tries.
type Attempt struct {
	Attempt int
	Status  StepStatus
	Key     string
	Input   json.RawMessage
	// Model is the provider/model an LLM attempt called (its journaled
	// input's), "" for other steps.
	Model      string
	Output     json.RawMessage
	Usage      *event.Usage
	Error      string
	Class      string
	Delivery   string
	Tries      int
	StartedAt  time.Time
	EndedAt    time.Time
	DurationMs int64
	// Side effect receipt of this attempt.
	Connector string
	Target    string
	Claimed   bool
	Delivered bool
	// Failed reports a definite failure: the target answered with an
	// error, so a claimed delivery did not happen.
	Failed         bool
	DeliveryStatus int
	ClaimedAt      time.Time
	DeliveredAt    time.Time
	// FirstSeq is the seq of the first event of this attempt; LastSeq
	// the seq of the last event that changed it.
	FirstSeq uint64
	LastSeq  uint64
	// WaitingAt is when the attempt began to wait (step_waiting: an
	// approval, a child run); zero if it never did.
	WaitingAt time.Time
	// Substeps are the sub-steps a process step's child reported, in the
	// order they first started.
	Substeps []Substep
}

// Substep is one sub-step a process step's child reported
// (substep_started, substep_completed). A completed sub-step stays
// completed: its output is what a resumed child's SDK helper returns.
type Substep struct {
	Name   string          `json:"name"`
	Status StepStatus      `json:"status"`
	Output json.RawMessage `json:"output,omitempty"`
}

// Substep returns the attempt's sub-step name, or nil.
func (a *Attempt) Substep(name string) *Substep {
	for i := range a.Substeps {
		if a.Substeps[i].Name == name {
			return &a.Substeps[i]
		}
	}
	return nil
}

// Step is the folded state of one step (its latest attempt).
type Step struct {
	ID       string
	NodeID   string
	NodeType string
	// Attempt is the current attempt; it keys the idempotency key.
	Attempt int
	// Retries counts journaled retries (step_retrying events).
	Retries int
	// Fallback is the index, in the node's model list, of the model the
	// step's next or current attempt calls (step_retrying.fallback);
	// ModelRetries counts the retries on that model, which its retry
	// policy bounds.
	Fallback     int
	ModelRetries int
	Status       StepStatus
	Input        json.RawMessage
	Key          string
	Output       json.RawMessage
	Usage        *event.Usage
	Error        string
	Class        string
	Delivery     string
	Claimed      bool // side_effect_claimed for the current attempt
	Delivered    bool // side_effect_delivered for the current attempt
	// DeliveryStatus is the receiver's HTTP status, once delivered.
	DeliveryStatus int
	ChildRunID     string
	// WaitReason and TimeoutAt describe a waiting step.
	WaitReason string
	TimeoutAt  time.Time
	// CompletedSeq is the seq of the step's step_completed.
	CompletedSeq uint64
	// SignalSeq is the seq of the signal a wait step took (0: it timed
	// out, or the step is no wait).
	SignalSeq uint64
	// CopiedFrom is set on a step a fork copied from its source run.
	CopiedFrom *event.CopiedFrom
	StartedAt  time.Time
	EndedAt    time.Time
	// RetryAt is when the next attempt may start, after a step_retrying.
	RetryAt    time.Time
	DurationMs int64
	// Attempts holds every attempt, in order.
	Attempts []*Attempt
	// Resumes counts the drives (run_resumed) that found this process
	// step's attempt running: processes that did not finish.
	Resumes int
	// Confidence is the journaled score of a gated step's attempt
	// (confidence_evaluated); nil when none was journaled.
	Confidence *Confidence
	// BypassedAttempt is the attempt whose gate was bypassed
	// (confidence_gate_bypassed), 0 for none.
	BypassedAttempt int

	outVal  any
	decoded bool
}

// AttemptState returns the state of attempt n, or nil.
func (s *Step) AttemptState(n int) *Attempt {
	for i := len(s.Attempts) - 1; i >= 0; i-- {
		if s.Attempts[i].Attempt == n {
			return s.Attempts[i]
		}
	}
	return nil
}

// attempt returns attempt n, creating it.
func (s *Step) attempt(n int, seq uint64) *Attempt {
	a := s.AttemptState(n)
	if a == nil {
		a = &Attempt{Attempt: n, FirstSeq: seq}
		s.Attempts = append(s.Attempts, a)
	}
	a.LastSeq = seq
	return a
}

// OutputValue returns the decoded output (numbers as json.Number).
func (s *Step) OutputValue() any {
	if !s.decoded {
		s.outVal = decode(s.Output)
		s.decoded = true
	}
	return s.outVal
}

// Confidence is the confidence_evaluated of one attempt of a step.
type Confidence struct {
	Attempt int
	event.ConfidenceEvaluatedData
}

// ConfidenceOf returns the journaled score of the step's current attempt,
// or nil.
func (s *Step) ConfidenceOf() *Confidence {
	if s.Confidence == nil || s.Confidence.Attempt != s.Attempt {
		return nil
	}
	return s.Confidence
}

// RunState is the folded state of a run.
type RunState struct {
	RunID  string
	Status Status
	// Created is the run_created payload.
	Created event.RunCreatedData
	// Workflow is the parsed snapshot; nil for a run whose snapshot does
	// not parse (WorkflowErr says why).
	Workflow    *workflow.Workflow
	WorkflowErr error

	Steps map[string]*Step
	// Decisions holds approval decisions by step id, from
	// approval_received; one may arrive before its step is reached.
	Decisions map[string]event.ApprovalReceivedData
	// Order lists step ids in the order they first started.
	Order []string
	// Signals holds every signal_received by name, oldest first; a wait
	// step takes the oldest one not yet Taken.
	Signals map[string][]*Signal

	LastSeq uint64
	// Resumes counts run_resumed events.
	Resumes int
	// CrashesAtStep counts consecutive crashed drives without progress.
	CrashesAtStep int
	// DriveOpen is true while a drive has begun (run_resumed) and has not
	// finished or parked the run. A new drive that finds it true knows the
	// previous one crashed.
	DriveOpen  bool
	LastWorker string

	Usage         event.Usage
	Output        json.RawMessage
	Error         string
	ErrorCode     string
	FailedStep    string
	LastCompleted string

	CreatedAt time.Time
	UpdatedAt time.Time
	EndedAt   time.Time

	// The brakes (brakes_fold.go). Budget is the effective budget: run_created's
	// plus every budget_raised; nil when the run has none. StepsStarted
	// counts the acting steps started (what maxSteps limits). Warned
	// holds the limits warned of; Exceeded the budget_exceeded not yet
	// answered by a budget_raised; Pause the brake the run is parked on.
	// Anomalies holds the journaled anomalies by type@step_id, in
	// AnomalyOrder.
	Budget       *event.Budget
	StepsStarted int64
	Warned       map[string]bool
	Exceeded     *event.BudgetExceededData
	Pause        *Pause
	Anomalies    map[string]event.AnomalyDetectedData
	AnomalyOrder []string
	cleared      map[string]bool
	br           brakes

	input   any
	decoded bool
	// copies indexes run_created's forked_from.copies by step id.
	copies map[string]*event.CopiedStep
	// outputs maps the id of every completed top-level step (and the
	// trigger) to its output, for the top-level template environment;
	// kept up to date by Apply so Next need not rebuild it.
	outputs map[string]any
	// loops memoizes, by loop step id, what Next found of a loop in
	// progress (planLoop); Apply drops a memo an event could change.
	loops map[string]*loopMemo
	// settled is Frontier's memo of the top-level graph's settled
	// prefix (settled.go); Apply drops it when an event could change it.
	settled *settled
	// loopNodes holds the decoded data of the loop nodes Next met: a
	// loop's data holds its whole body, too much to decode at each step.
	loopNodes map[*workflow.Node]*workflow.LoopData
}

// Signal is one signal_received, and which step took it.
type Signal struct {
	Seq     uint64
	Payload json.RawMessage
	By      string
	At      time.Time
	// TakenBy is the wait step that took it ("" while it is pending).
	TakenBy string
}

// PendingSignal returns the oldest signal of name no wait step has taken,
// or nil.
func (st *RunState) PendingSignal(name string) *Signal {
	for _, sg := range st.Signals[name] {
		if sg.TakenBy == "" {
			return sg
		}
	}
	return nil
}

// PendingSignals counts the signals of name no wait step has taken.
func (st *RunState) PendingSignals(name string) int {
	n := 0
	for _, sg := range st.Signals[name] {
		if sg.TakenBy == "" {
			n++
		}
	}
	return n
}

// Input returns the decoded run input.
func (st *RunState) Input() any {
	if !st.decoded {
		st.input = decode(st.Created.Input)
		st.decoded = true
	}
	return st.input
}

func (st *RunState) step(id string) *Step {
	s, ok := st.Steps[id]
	if !ok {
		s = &Step{ID: id}
		st.Steps[id] = s
		st.Order = append(st.Order, id)
	}
	return s
}

func decode(raw json.RawMessage) any {
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil
	}
	return v
}

// setOutput records a completed step's output for the template
// environment. Outputs stay raw JSON; templates decode what they read.
func (st *RunState) setOutput(id string, raw json.RawMessage) {
	if st.outputs == nil {
		st.outputs = map[string]any{}
	}
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	st.outputs[id] = raw
}
