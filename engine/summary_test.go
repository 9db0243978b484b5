package engine_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// summary is the JSON form of a folded run and its next action, as the
// golden files hold it.
type summary struct {
	RunID         string          `json:"run_id"`
	Status        engine.Status   `json:"status"`
	Workflow      string          `json:"workflow,omitempty"`
	WorkflowError string          `json:"workflow_error,omitempty"`
	Steps         []stepSummary   `json:"steps"`
	Usage         event.Usage     `json:"usage"`
	LastSeq       uint64          `json:"last_seq"`
	Resumes       int             `json:"resumes"`
	CrashesAtStep int             `json:"crashes_at_step"`
	DriveOpen     bool            `json:"drive_open"`
	LastWorker    string          `json:"last_worker,omitempty"`
	LastCompleted string          `json:"last_completed,omitempty"`
	Output        json.RawMessage `json:"output,omitempty"`
	Error         string          `json:"error,omitempty"`
	ErrorCode     string          `json:"error_code,omitempty"`
	FailedStep    string          `json:"failed_step,omitempty"`
	CreatedAt     string          `json:"created_at"`
	UpdatedAt     string          `json:"updated_at"`
	EndedAt       string          `json:"ended_at,omitempty"`
	// The brakes.
	Budget       *event.Budget               `json:"budget,omitempty"`
	Spent        engine.Spend                `json:"spent"`
	Warned       []string                    `json:"warned,omitempty"`
	Exceeded     *event.BudgetExceededData   `json:"exceeded,omitempty"`
	Pause        *engine.Pause               `json:"pause,omitempty"`
	Anomalies    []event.AnomalyDetectedData `json:"anomalies,omitempty"`
	PendingAnoms []event.AnomalyDetectedData `json:"pending_anomalies,omitempty"`
	// Signals are the signals received, by name, oldest first.
	Signals map[string][]signalSummary `json:"signals,omitempty"`
	// Next is Next's action at the time of the last event.
	Next nextSummary `json:"next"`
	// Ready lists the steps of Frontier's set at that time, with nothing
	// busy (what a drive resuming the run sends), when there are several.
	Ready []string `json:"ready,omitempty"`
	// NextAtDeadline is Next's action at the deadline of a waiting step,
	// when a step waits with one.
	NextAtDeadline *nextSummary `json:"next_at_deadline,omitempty"`
}

type stepSummary struct {
	ID             string            `json:"id"`
	NodeType       string            `json:"node_type,omitempty"`
	Status         engine.StepStatus `json:"status"`
	Attempt        int               `json:"attempt"`
	Retries        int               `json:"retries"`
	Key            string            `json:"key,omitempty"`
	Output         json.RawMessage   `json:"output,omitempty"`
	Usage          *event.Usage      `json:"usage,omitempty"`
	Claimed        bool              `json:"claimed"`
	Delivered      bool              `json:"delivered"`
	Delivery       string            `json:"delivery,omitempty"`
	DeliveryStatus int               `json:"delivery_status,omitempty"`
	Error          string            `json:"error,omitempty"`
	Class          string            `json:"class,omitempty"`
	RetryAt        string            `json:"retry_at,omitempty"`
	SignalSeq      uint64            `json:"signal_seq,omitempty"`
	CopiedFrom     *event.CopiedFrom `json:"copied_from,omitempty"`
	Attempts       []attemptSummary  `json:"attempts"`
}

// signalSummary is one signal_received and the step that took it.
type signalSummary struct {
	Seq     uint64          `json:"seq"`
	Payload json.RawMessage `json:"payload"`
	By      string          `json:"by,omitempty"`
	TakenBy string          `json:"taken_by,omitempty"`
}

// attemptSummary is one attempt of a step (a steps-table row).
type attemptSummary struct {
	Attempt        int               `json:"attempt"`
	Status         engine.StepStatus `json:"status"`
	Key            string            `json:"key,omitempty"`
	Tries          int               `json:"tries"`
	Error          string            `json:"error,omitempty"`
	Delivery       string            `json:"delivery,omitempty"`
	Claimed        bool              `json:"claimed,omitempty"`
	Delivered      bool              `json:"delivered,omitempty"`
	Failed         bool              `json:"failed,omitempty"`
	DeliveryStatus int               `json:"delivery_status,omitempty"`
	Target         string            `json:"target,omitempty"`
	StartedAt      string            `json:"started_at,omitempty"`
	EndedAt        string            `json:"ended_at,omitempty"`
	LastSeq        uint64            `json:"last_seq"`
}

// nextSummary is Next's action: type is done, run_step, complete or fail.
type nextSummary struct {
	Type      string          `json:"type"`
	Status    engine.Status   `json:"status,omitempty"`
	StepID    string          `json:"step_id,omitempty"`
	NodeType  string          `json:"node_type,omitempty"`
	Attempt   int             `json:"attempt,omitempty"`
	Tries     int             `json:"tries,omitempty"`
	Started   bool            `json:"started,omitempty"`
	Key       string          `json:"key,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	Claimed   bool            `json:"claimed,omitempty"`
	Delivered bool            `json:"delivered,omitempty"`
	NotBefore string          `json:"not_before,omitempty"`
	Pure      bool            `json:"pure,omitempty"`
	Output    json.RawMessage `json:"output,omitempty"`
	Code      string          `json:"code,omitempty"`
	Error     string          `json:"error,omitempty"`
	Wait      *waitSummary    `json:"wait,omitempty"`
	// Kind and Data are a Note's; Reason and Waiting a Park's.
	Kind      event.Kind `json:"kind,omitempty"`
	Data      any        `json:"data,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	Waiting   bool       `json:"waiting,omitempty"`
	SignalSeq uint64     `json:"signal_seq,omitempty"`
}

// waitSummary is a planned wait.
type waitSummary struct {
	Reason    string `json:"reason"`
	Signal    string `json:"signal,omitempty"`
	Waiting   bool   `json:"waiting"`
	TimeoutMs int    `json:"timeout_ms,omitempty"`
	TimeoutAt string `json:"timeout_at,omitempty"`
}

func timeString(ts time.Time) string {
	if ts.IsZero() {
		return ""
	}
	return ts.UTC().Format(time.RFC3339Nano)
}

func summarise(st *engine.RunState, next engine.Action) summary {
	s := summary{
		RunID: st.RunID, Status: st.Status, Workflow: st.Created.WorkflowName,
		Steps: []stepSummary{}, Usage: st.Usage, LastSeq: st.LastSeq, Resumes: st.Resumes,
		CrashesAtStep: st.CrashesAtStep, DriveOpen: st.DriveOpen, LastWorker: st.LastWorker,
		LastCompleted: st.LastCompleted, Output: st.Output, Error: st.Error, ErrorCode: st.ErrorCode,
		FailedStep: st.FailedStep, CreatedAt: timeString(st.CreatedAt), UpdatedAt: timeString(st.UpdatedAt),
		EndedAt: timeString(st.EndedAt), Next: summariseAction(next),
	}
	if st.WorkflowErr != nil {
		s.WorkflowError = st.WorkflowErr.Error()
	}
	if st.RunID != "" {
		s.Budget, s.Spent, s.Exceeded, s.Pause = st.Budget, st.Spent(), st.Exceeded, st.Pause
		s.Anomalies, s.PendingAnoms = st.AnomalyList(), st.PendingAnomalies()
		for _, l := range []string{event.LimitCost, event.LimitTokens, event.LimitSteps, event.LimitDuration} {
			if st.Warned[l] {
				s.Warned = append(s.Warned, l)
			}
		}
		if len(s.Anomalies) == 0 {
			s.Anomalies = nil
		}
	}
	for name, sgs := range st.Signals {
		if s.Signals == nil {
			s.Signals = map[string][]signalSummary{}
		}
		for _, sg := range sgs {
			s.Signals[name] = append(s.Signals[name], signalSummary{Seq: sg.Seq, Payload: sg.Payload, By: sg.By, TakenBy: sg.TakenBy})
		}
	}
	for _, id := range st.Order {
		x := st.Steps[id]
		s.Steps = append(s.Steps, stepSummary{
			ID: x.ID, NodeType: x.NodeType, Status: x.Status, Attempt: x.Attempt, Retries: x.Retries,
			Key: x.Key, Output: x.Output, Usage: x.Usage, Claimed: x.Claimed, Delivered: x.Delivered,
			Delivery: x.Delivery, DeliveryStatus: x.DeliveryStatus, Error: x.Error, Class: x.Class,
			RetryAt: timeString(x.RetryAt), SignalSeq: x.SignalSeq, CopiedFrom: x.CopiedFrom, Attempts: []attemptSummary{},
		})
		last := &s.Steps[len(s.Steps)-1]
		for _, a := range x.Attempts {
			last.Attempts = append(last.Attempts, attemptSummary{Attempt: a.Attempt, Status: a.Status, Key: a.Key,
				Tries: a.Tries, Error: a.Error, Delivery: a.Delivery, Claimed: a.Claimed, Delivered: a.Delivered, Failed: a.Failed,
				DeliveryStatus: a.DeliveryStatus, Target: a.Target, StartedAt: timeString(a.StartedAt),
				EndedAt: timeString(a.EndedAt), LastSeq: a.LastSeq})
		}
	}
	return s
}

func summariseAction(a engine.Action) nextSummary {
	switch a := a.(type) {
	case engine.Done:
		return nextSummary{Type: "done", Status: a.Status}
	case engine.Complete:
		return nextSummary{Type: "complete", Output: a.Output}
	case engine.Fail:
		return nextSummary{Type: "fail", Code: a.Code, StepID: a.StepID, Error: a.Error}
	case engine.Note:
		return nextSummary{Type: "note", Kind: a.Kind, StepID: a.StepID, Data: a.Data}
	case engine.Park:
		return nextSummary{Type: "park", Reason: a.Reason, StepID: a.StepID, Waiting: a.Waiting}
	case engine.RunStep:
		p := a.Plan
		n := nextSummary{Type: "run_step", StepID: p.StepID, NodeType: p.NodeType, Attempt: p.Attempt,
			Tries: p.Tries, Started: p.Started, Key: p.Key, Input: p.Input, Claimed: p.Claimed,
			Delivered: p.Delivered, NotBefore: timeString(p.NotBefore), Pure: p.Pure, Output: p.Output, SignalSeq: p.SignalSeq}
		if w := p.Wait; w != nil {
			n.Wait = &waitSummary{Reason: w.Reason, Signal: w.Signal, Waiting: w.Waiting, TimeoutMs: w.TimeoutMs, TimeoutAt: timeString(w.TimeoutAt)}
		}
		return n
	default:
		return nextSummary{Type: "unknown"}
	}
}

// foldSummary folds evs and summarises the state with its next action at
// the time of the last event (and at a waiting step's deadline), as
// indented JSON.
func foldSummary(t testing.TB, evs []event.Event) []byte {
	t.Helper()
	st, err := engine.Fold(evs)
	require.NoError(t, err)
	return stateSummary(t, st)
}

// stateSummary summarises st as foldSummary does.
func stateSummary(t testing.TB, st *engine.RunState) []byte {
	t.Helper()
	s := summarise(st, engine.Next(st.Workflow, st, st.UpdatedAt))
	if rs, ok := engine.Frontier(context.Background(), st.Workflow, st, st.UpdatedAt, nil).(engine.RunSteps); ok && len(rs.Plans) > 1 {
		for _, p := range rs.Plans {
			s.Ready = append(s.Ready, p.StepID)
		}
	}
	for _, id := range st.Order {
		if x := st.Steps[id]; x.Status == engine.StepWaiting && !x.TimeoutAt.IsZero() && !st.Status.Terminal() {
			n := summariseAction(engine.Next(st.Workflow, st, x.TimeoutAt))
			s.NextAtDeadline = &n
			break
		}
	}
	b, err := json.MarshalIndent(s, "", "  ")
	require.NoError(t, err)
	return append(b, '\n')
}
