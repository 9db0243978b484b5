package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// The fold of a step's life: started, completed, failed, retried, parked.

func (st *RunState) onStepStarted(ev event.Event, d event.StepStartedData) error {
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
	a.Model = llmModel(ev.StepID, d.NodeType, d.Input)
	a.Tries++
	if a.StartedAt.IsZero() {
		a.StartedAt = ev.TS
	}
	return nil
}

func (st *RunState) onStepCompleted(ev event.Event, d event.StepCompletedData) error {
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
	return nil
}

func (st *RunState) onStepFailed(ev event.Event, d event.StepFailedData) error {
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
	return nil
}

func (st *RunState) onStepRetrying(ev event.Event, d event.StepRetryingData) error {
	s := st.step(ev.StepID)
	// A journaled retry authorises one more try, even of a claimed
	// delivery whose outcome was unknown (same attempt, same key).
	s.Claimed, s.Delivered = false, false
	failed := s.attempt(s.Attempt, ev.Seq)
	failed.Status, failed.Error, failed.Class, failed.EndedAt = StepRetried, d.Error, d.Class, ev.TS
	if d.Usage != nil {
		// An answer that did not do (one that failed its responseSchema)
		// was paid for all the same.
		failed.Usage = d.Usage
		st.Usage.Add(*d.Usage)
	}
	// A retry with the next attempt follows a definite failure; one with
	// the same attempt, an unknown outcome.
	failed.Failed = d.Attempt != s.Attempt
	if d.Attempt != s.Attempt {
		s.Key = event.IdempotencyKey(st.RunID, ev.StepID, d.Attempt)
	}
	s.Attempt = d.Attempt
	s.Retries++
	if d.Fallback != s.Fallback {
		s.Fallback, s.ModelRetries = d.Fallback, 0
	} else {
		s.ModelRetries++
	}
	s.Status = StepRetrying
	s.Error, s.Class = d.Error, d.Class
	s.RetryAt = ev.TS.Add(time.Duration(d.DelayMs) * time.Millisecond)
	st.seeRetry(s)
	return nil
}

// onStepWaiting parks the run: on a step's wait (an approval, a signal,
// a child), or on a brake, which leaves the step alone (parkOn).
func (st *RunState) onStepWaiting(ev event.Event, d event.StepWaitingData) error {
	if d.Reason == event.WaitBudget || d.Reason == event.WaitAnomaly {
		st.parkOn(d.Reason, ev.StepID)
		return nil
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
	return nil
}

// llmModel is the provider/model an LLM step's journaled input names: an
// ai-step's or an agent turn's; "" for other steps.
func llmModel(stepID, nodeType string, input json.RawMessage) string {
	switch {
	case nodeType == workflow.TypeAIStep:
	case nodeType == workflow.TypeAgent && isTurn(stepID):
	default:
		return ""
	}
	var in struct {
		Provider string `json:"provider"`
		Model    string `json:"model"`
	}
	if json.Unmarshal(input, &in) != nil || in.Model == "" {
		return ""
	}
	return in.Provider + "/" + in.Model
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

// isTurn reports whether an agent's step id names a model turn
// (ask.turn[2]), not one of its tool calls (ask.turn[2].tool[0]).
func isTurn(stepID string) bool {
	i := strings.LastIndex(stepID, ".turn[")
	return i >= 0 && !strings.Contains(stepID[i:], ".tool[")
}
