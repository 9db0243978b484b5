package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
	Attempt    int
	Status     StepStatus
	Key        string
	Input      json.RawMessage
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
	Retries   int
	Status    StepStatus
	Input     json.RawMessage
	Key       string
	Output    json.RawMessage
	Usage     *event.Usage
	Error     string
	Class     string
	Delivery  string
	Claimed   bool // side_effect_claimed for the current attempt
	Delivered bool // side_effect_delivered for the current attempt
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

	// The brakes (brakes.go). Budget is the effective budget: run_created's
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
	// loopNodes holds the decoded data of the loop nodes Next met: a
	// loop's data holds its whole body, too much to decode at each step.
	loopNodes map[*workflow.Node]*workflow.LoopData
}

// loopData is node.Loop(), decoded once per state.
func (st *RunState) loopData(node *workflow.Node) (*workflow.LoopData, error) {
	if d, ok := st.loopNodes[node]; ok {
		return d, nil
	}
	d, err := node.Loop()
	if err != nil {
		return nil, err
	}
	if st.loopNodes == nil {
		st.loopNodes = map[*workflow.Node]*workflow.LoopData{}
	}
	st.loopNodes[node] = d
	return d, nil
}

// loopMemo is what Next found of one loop step in progress: under the
// rendered over and with (and the body), iterations 0..done-1 finished
// without stopping the loop, with results. A finished iteration's walk
// reads only the steps of that iteration, which no event changes without
// naming one of them, so the memo holds until such an event (forget).
type loopMemo struct {
	body             *workflow.Workflow
	overRaw, withRaw string
	items, with      any // over and with, decoded
	done             int
	results          []json.RawMessage
}

// loopMemo returns the memo of loop step sid under body and the rendered
// over and with, a fresh one when it has none or they changed.
func (st *RunState) loopMemo(sid string, body *workflow.Workflow, over, with json.RawMessage) *loopMemo {
	if m, ok := st.loops[sid]; ok && (m.body == body || m.body == nil) && m.overRaw == string(over) && m.withRaw == string(with) {
		// A memo from a snapshot (DecodeState) has no body yet: a loop's
		// step id names its node, so its body is this one.
		m.body = body
		return m
	}
	m := &loopMemo{body: body, overRaw: string(over), withRaw: string(with), items: decode(over), with: decode(with)}
	if st.loops == nil {
		st.loops = map[string]*loopMemo{}
	}
	st.loops[sid] = m
	return m
}

// forget drops the loop memos an event of step id could change: that of
// the loop itself when it ends, and that of a loop whose finished
// iterations hold the step. A memo of a loop in progress normally meets
// only events of its current iteration, so this costs a prefix test per
// loop in progress.
func (st *RunState) forget(kind event.Kind, id string) {
	for k, m := range st.loops {
		if id == k {
			if kind == event.StepCompleted || kind == event.StepFailed {
				delete(st.loops, k)
			}
			continue
		}
		if len(id) <= len(k) || id[len(k)] != '[' || id[:len(k)] != k {
			continue
		}
		rest := id[len(k)+1:]
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			continue
		}
		if i, err := parseIndex(rest[:end]); err != nil || i < m.done {
			delete(st.loops, k)
		}
	}
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
	if err := st.apply(ev); err != nil {
		return err
	}
	if len(st.loops) > 0 && ev.StepID != "" {
		st.forget(ev.Kind, ev.StepID)
	}
	st.LastSeq = ev.Seq
	st.UpdatedAt = ev.TS
	return nil
}

func (st *RunState) apply(ev event.Event) error {
	switch ev.Kind {
	case event.RunCreated:
		if st.LastSeq != 0 {
			return fmt.Errorf("run %s: run_created at seq %d: the run was created at seq 1", st.RunID, ev.Seq)
		}
		if err := ev.DecodeData(&st.Created); err != nil {
			return err
		}
		st.Status = StatusQueued
		st.CreatedAt = ev.TS
		if f := st.Created.ForkedFrom; f != nil && len(f.Copies) > 0 {
			st.copies = make(map[string]*event.CopiedStep, len(f.Copies))
			for i := range f.Copies {
				st.copies[f.Copies[i].StepID] = &f.Copies[i]
			}
		}
		if len(st.Created.Workflow) > 0 {
			st.Workflow, st.WorkflowErr = workflow.ParseCached(st.Created.Workflow)
		}
		if st.Workflow != nil {
			if t := st.Workflow.Trigger(); t != nil {
				st.setOutput(t.ID, st.Created.Input)
			}
		}
		st.initBrakes()
	case event.RunResumed:
		var d event.RunResumedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		st.Resumes = d.ResumeCount
		st.CrashesAtStep = d.CrashesAtStep
		st.LastWorker = d.Worker
		st.DriveOpen = true
		st.Status = StatusRunning
		for _, id := range st.Order {
			if s := st.Steps[id]; s.Status == StepRunning && s.NodeType == workflow.TypeProcess {
				s.Resumes++
			}
		}
	case event.StepStarted:
		var d event.StepStartedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		s := st.step(ev.StepID)
		if s.StartedAt.IsZero() {
			if acting(d.NodeType, ev.StepID) {
				st.StepsStarted++
			}
			st.seeStarted(ev.StepID, d.NodeType, d.Input)
		}
		if s.Attempt != ev.Attempt {
			s.Claimed, s.Delivered = false, false
		}
		s.NodeID, s.NodeType, s.Attempt = d.NodeID, d.NodeType, ev.Attempt
		s.Input, s.Key = d.Input, d.IdempotencyKey
		s.Status = StepRunning
		s.Resumes = 0
		s.StartedAt = ev.TS
		s.Error, s.Class = "", ""
		a := s.attempt(ev.Attempt, ev.Seq)
		a.Status, a.Key, a.Input, a.Error, a.Class, a.Failed = StepRunning, d.IdempotencyKey, d.Input, "", "", false
		a.Tries++
		if a.StartedAt.IsZero() {
			a.StartedAt = ev.TS
		}
	case event.SideEffectClaimed:
		var d event.SideEffectClaimedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		s := st.step(ev.StepID)
		if ev.Attempt == s.Attempt {
			s.Claimed = true
		}
		a := s.attempt(ev.Attempt, ev.Seq)
		a.Claimed, a.Connector, a.Target = true, d.Connector, d.Target
		if a.ClaimedAt.IsZero() {
			a.ClaimedAt = ev.TS
		}
	case event.SideEffectDelivered:
		var d event.SideEffectDeliveredData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		s := st.step(ev.StepID)
		if ev.Attempt == s.Attempt {
			s.Delivered = true
			s.DeliveryStatus = d.Status
		}
		a := s.attempt(ev.Attempt, ev.Seq)
		a.Delivered, a.DeliveryStatus, a.DeliveredAt = true, d.Status, ev.TS
	case event.StepCompleted:
		var d event.StepCompletedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		s := st.step(ev.StepID)
		if ev.Attempt != 0 {
			s.Attempt = ev.Attempt
		}
		s.Status = StepCompleted
		s.Output, s.Usage, s.Delivery, s.DurationMs = d.Output, d.Usage, d.Delivery, d.DurationMs
		s.decoded = false
		s.EndedAt = ev.TS
		if d.Usage != nil {
			st.Usage.Add(*d.Usage)
		}
		st.LastCompleted = ev.StepID
		st.CrashesAtStep = 0
		s.CompletedSeq = ev.Seq
		s.SignalSeq, s.CopiedFrom = d.SignalSeq, d.CopiedFrom
		if d.SignalSeq != 0 {
			if err := st.takeSignal(ev, d.SignalSeq); err != nil {
				return err
			}
		}
		s.WaitReason, s.TimeoutAt = "", time.Time{}
		if st.Workflow != nil && st.Workflow.Index(ev.StepID) >= 0 {
			// Only the top-level nodes' steps: a loop's iterations and an
			// agent's turns are not in the environment, and would make
			// what reads it all grow with them.
			st.setOutput(ev.StepID, d.Output)
		}
		s.RetryAt = time.Time{}
		a := s.attempt(s.Attempt, ev.Seq)
		a.Status, a.Output, a.Usage, a.Delivery, a.DurationMs, a.EndedAt = StepCompleted, d.Output, d.Usage, d.Delivery, d.DurationMs, ev.TS
		st.seeCompleted(s, d.Usage, d.Output)
	case event.StepFailed:
		var d event.StepFailedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		s := st.step(ev.StepID)
		s.Status = StepFailed
		s.Error, s.Class, s.DurationMs = d.Error, d.Class, d.DurationMs
		s.EndedAt = ev.TS
		if d.Usage != nil {
			// A failed child run's spend is spent all the same.
			s.Usage = d.Usage
			st.Usage.Add(*d.Usage)
		}
		a := s.attempt(s.Attempt, ev.Seq)
		a.Status, a.Error, a.Class, a.DurationMs, a.EndedAt = StepFailed, d.Error, d.Class, d.DurationMs, ev.TS
		a.Failed = !d.OutcomeUnknown
	case event.StepRetrying:
		var d event.StepRetryingData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		s := st.step(ev.StepID)
		// A journaled retry authorises one more try, even of a claimed
		// delivery whose outcome was unknown (same attempt, same key).
		s.Claimed, s.Delivered = false, false
		failed := s.attempt(s.Attempt, ev.Seq)
		failed.Status, failed.Error, failed.Class, failed.EndedAt = StepRetried, d.Error, d.Class, ev.TS
		// A retry with the next attempt follows a definite failure; one with
		// the same attempt, an unknown outcome.
		failed.Failed = d.Attempt != s.Attempt
		if d.Attempt != s.Attempt {
			s.Key = event.IdempotencyKey(st.RunID, ev.StepID, d.Attempt)
		}
		s.Attempt = d.Attempt
		s.Retries++
		s.Status = StepRetrying
		s.Error, s.Class = d.Error, d.Class
		s.RetryAt = ev.TS.Add(time.Duration(d.DelayMs) * time.Millisecond)
		st.seeRetry(s)
	case event.StepWaiting:
		var d event.StepWaitingData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		if d.Reason == event.WaitBudget || d.Reason == event.WaitAnomaly {
			st.parkOn(d.Reason, ev.StepID)
			break
		}
		s := st.step(ev.StepID)
		s.Status = StepWaiting
		s.WaitReason = d.Reason
		if d.TimeoutAt != "" {
			t, err := time.Parse(time.RFC3339Nano, d.TimeoutAt)
			if err != nil {
				return fmt.Errorf("run %s seq %d: step_waiting timeout_at: %w", ev.RunID, ev.Seq, err)
			}
			s.TimeoutAt = t
		}
		a := s.attempt(max(s.Attempt, 1), ev.Seq)
		a.Status = StepWaiting
		if a.WaitingAt.IsZero() {
			a.WaitingAt = ev.TS
		}
		if d.ChildRunID != "" {
			s.ChildRunID = d.ChildRunID
		}
		st.Status = StatusWaiting
		st.DriveOpen = false
	case event.ChildRunCreated:
		var d event.ChildRunCreatedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		st.step(ev.StepID).ChildRunID = d.ChildRunID
	case event.RunSucceeded:
		var d event.RunSucceededData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		st.Output = d.Output
		st.end(StatusSucceeded, ev.TS)
	case event.RunFailed:
		var d event.RunFailedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		st.Error, st.ErrorCode, st.FailedStep = d.Error, d.Code, d.StepID
		st.end(StatusFailed, ev.TS)
	case event.RunCancelled:
		var d event.RunCancelledData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		st.Error = "cancelled"
		if d.Reason != "" {
			st.Error = "cancelled: " + d.Reason
		}
		st.end(StatusCancelled, ev.TS)
	case event.ApprovalReceived:
		var d event.ApprovalReceivedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		if st.decidePause(ev.StepID, d) {
			break
		}
		if _, ok := st.Decisions[ev.StepID]; !ok {
			st.Decisions[ev.StepID] = d
		}
	case event.SubstepStarted:
		var d event.SubstepStartedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		s := st.step(ev.StepID)
		a := s.attempt(max(ev.Attempt, 1), ev.Seq)
		if a.Substep(d.Name) == nil {
			a.Substeps = append(a.Substeps, Substep{Name: d.Name, Status: StepRunning})
		}
	case event.SubstepCompleted:
		var d event.SubstepCompletedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		s := st.step(ev.StepID)
		a := s.attempt(max(ev.Attempt, 1), ev.Seq)
		sub := a.Substep(d.Name)
		if sub == nil {
			a.Substeps = append(a.Substeps, Substep{Name: d.Name})
			sub = &a.Substeps[len(a.Substeps)-1]
		}
		if sub.Status != StepCompleted {
			sub.Status, sub.Output = StepCompleted, d.Output
		}
	case event.AnomalyDetected, event.BudgetWarning, event.BudgetExceeded, event.BudgetRaised:
		return st.applyBrake(ev)
	case event.ConfidenceEvaluated:
		var d event.ConfidenceEvaluatedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		// A score describes an attempt that started; one of no step is
		// only recorded.
		if s, ok := st.Steps[ev.StepID]; ok {
			s.Confidence = &Confidence{Attempt: ev.Attempt, ConfidenceEvaluatedData: d}
		}
	case event.ConfidenceGateBypassed:
		if s, ok := st.Steps[ev.StepID]; ok {
			s.BypassedAttempt = ev.Attempt
		}
	case event.SignalReceived:
		var d event.SignalReceivedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		if st.Signals == nil {
			st.Signals = map[string][]*Signal{}
		}
		st.Signals[d.Signal] = append(st.Signals[d.Signal], &Signal{Seq: ev.Seq, Payload: d.Payload, By: d.By, At: ev.TS})
	default:
		return fmt.Errorf("run %s: unknown event kind %q at seq %d", ev.RunID, ev.Kind, ev.Seq)
	}
	return nil
}

// takeSignal marks the signal at seq taken by the step completing in ev.
// A signal is taken once: a second taker is a journal that does not fold.
func (st *RunState) takeSignal(ev event.Event, seq uint64) error {
	for _, sgs := range st.Signals {
		for _, sg := range sgs {
			if sg.Seq != seq {
				continue
			}
			if sg.TakenBy != "" {
				return fmt.Errorf("run %s seq %d: step %s takes the signal at seq %d, which step %s took", st.RunID, ev.Seq, ev.StepID, seq, sg.TakenBy)
			}
			sg.TakenBy = ev.StepID
			return nil
		}
	}
	return fmt.Errorf("run %s seq %d: step %s takes a signal at seq %d, which is no signal_received", st.RunID, ev.Seq, ev.StepID, seq)
}

func (st *RunState) end(s Status, ts time.Time) {
	st.Status = s
	st.EndedAt = ts
	st.DriveOpen = false
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
