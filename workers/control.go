package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/workflow"
)

// Errors of the write-side commands. Callers map them to answers: an
// *InputError is the caller's mistake (400), ErrRunNotFound 404,
// ErrRunFinished and ErrNotWaiting 409.
var (
	// ErrRunFinished refuses a command for a run that has ended.
	ErrRunFinished = errors.New("run already finished")
	// ErrNotWaiting refuses an approval or signal for a step that is not
	// waiting for one.
	ErrNotWaiting = errors.New("step is not waiting")
)

// InputError is a command the caller got wrong: it names the field.
type InputError struct {
	Field string
	Msg   string
}

func (e *InputError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// CancelRequest asks to cancel a run.
type CancelRequest struct {
	RunID  string
	Reason string
	// By names who cancels (an API token's name, a user); it becomes the
	// worker_id of run_cancelled.
	By string
}

// CancelSubjectPrefix is the core NATS subject prefix on which a cancel is
// announced, so the worker driving the run cancels its in-flight call at
// once. The journal, not this notice, is the truth: a worker that misses it
// finds run_cancelled on its next append.
const CancelSubjectPrefix = "pal.ctl.cancel."

// CancelRun appends run_cancelled to a running, waiting or queued run,
// exactly once: concurrent cancels and the run's own end race on the
// fenced append, and only one terminal event can win. nc, when not nil,
// announces the cancel to the driving worker.
//
// Errors: *InputError for a bad run id, eventstore.ErrRunNotFound,
// ErrRunFinished (the run had already ended; nothing is written).
func CancelRun(ctx context.Context, store *eventstore.Store, nc *nats.Conn, req CancelRequest) error {
	if err := event.ValidateRunID(req.RunID); err != nil {
		return &InputError{Field: "run_id", Msg: err.Error()}
	}
	by := req.By
	if by == "" {
		by = "pal"
	}
	for tries := 0; ; tries++ {
		evs, head, err := store.Read(ctx, req.RunID)
		if err != nil {
			return err
		}
		st, err := engine.Fold(evs)
		if err != nil {
			return fmt.Errorf("cancelling run %s: %w", req.RunID, err)
		}
		if st.Status.Terminal() {
			return fmt.Errorf("cancelling run %s: %w (%s)", req.RunID, ErrRunFinished, st.Status)
		}
		ev := event.MustNew(event.RunCancelled, "", 0, event.RunCancelledData{Reason: req.Reason, By: by})
		ev.WorkerID = by
		_, err = store.Append(ctx, req.RunID, head, ev)
		if errors.Is(err, eventstore.ErrConflict) && tries < 10 {
			continue // the run moved on; look again
		}
		if err != nil {
			return fmt.Errorf("cancelling run %s: %w", req.RunID, err)
		}
		if nc != nil {
			_ = nc.Publish(CancelSubjectPrefix+req.RunID, nil)
		}
		// Child runs go with their parent.
		for _, id := range st.Order {
			if child := st.Steps[id].ChildRunID; child != "" {
				err := CancelRun(ctx, store, nc, CancelRequest{RunID: child, Reason: "parent run " + req.RunID + " cancelled", By: by})
				if err != nil && !errors.Is(err, ErrRunFinished) && !errors.Is(err, eventstore.ErrRunNotFound) {
					return fmt.Errorf("cancelling child run %s: %w", child, err)
				}
			}
		}
		return nil
	}
}

// RunView is a run as read from its journal: always current, no read
// side involved.
type RunView struct {
	RunID        string          `json:"run_id"`
	Status       engine.Status   `json:"status"`
	Workflow     string          `json:"workflow,omitempty"`
	Input        json.RawMessage `json:"input,omitempty"`
	Output       json.RawMessage `json:"output,omitempty"`
	Error        string          `json:"error,omitempty"`
	ErrorCode    string          `json:"error_code,omitempty"`
	FailedStep   string          `json:"failed_step,omitempty"`
	ParentRunID  string          `json:"parent_run_id,omitempty"`
	ParentStepID string          `json:"parent_step_id,omitempty"`
	Depth        int             `json:"depth"`
	Usage        event.Usage     `json:"usage"`
	Resumes      int             `json:"resumes"`
	LastSeq      uint64          `json:"last_seq"`
	CreatedAt    string          `json:"created_at"`
	UpdatedAt    string          `json:"updated_at"`
	EndedAt      string          `json:"ended_at,omitempty"`
	Steps        []StepView      `json:"steps"`
}

// StepView is one step of a RunView.
type StepView struct {
	StepID     string            `json:"step_id"`
	NodeType   string            `json:"node_type,omitempty"`
	Status     engine.StepStatus `json:"status"`
	Attempt    int               `json:"attempt"`
	Output     json.RawMessage   `json:"output,omitempty"`
	Error      string            `json:"error,omitempty"`
	Delivery   string            `json:"delivery,omitempty"`
	DurationMs int64             `json:"duration_ms"`
	Usage      *event.Usage      `json:"usage,omitempty"`
}

// GetRun folds a run's journal into a RunView. Errors: *InputError,
// eventstore.ErrRunNotFound.
func GetRun(ctx context.Context, store *eventstore.Store, runID string) (*RunView, error) {
	if err := event.ValidateRunID(runID); err != nil {
		return nil, &InputError{Field: "run_id", Msg: err.Error()}
	}
	evs, _, err := store.Read(ctx, runID)
	if err != nil {
		return nil, err
	}
	st, err := engine.Fold(evs)
	if err != nil {
		return nil, fmt.Errorf("reading run %s: %w", runID, err)
	}
	return View(st), nil
}

// View renders a folded run.
func View(st *engine.RunState) *RunView {
	v := &RunView{RunID: st.RunID, Status: st.Status, Workflow: st.Created.WorkflowName, Input: st.Created.Input,
		Output: st.Output, Error: st.Error, ErrorCode: st.ErrorCode, FailedStep: st.FailedStep,
		ParentRunID: st.Created.ParentRunID, ParentStepID: st.Created.ParentStepID, Depth: st.Created.Depth,
		Usage: st.Usage, Resumes: st.Resumes, LastSeq: st.LastSeq, Steps: []StepView{},
		CreatedAt: rfc3339(st.CreatedAt), UpdatedAt: rfc3339(st.UpdatedAt), EndedAt: rfc3339(st.EndedAt)}
	for _, id := range st.Order {
		s := st.Steps[id]
		v.Steps = append(v.Steps, StepView{StepID: s.ID, NodeType: s.NodeType, Status: s.Status, Attempt: s.Attempt,
			Output: s.Output, Error: s.Error, Delivery: s.Delivery, DurationMs: s.DurationMs, Usage: s.Usage})
	}
	return v
}

// ApproveRequest records a human decision on an approval step.
type ApproveRequest struct {
	RunID    string
	StepID   string
	Approve  bool
	Approver string
	Comment  string
}

// Approve records a decision on an approval step: it appends
// approval_received (fenced; concurrent decisions cannot both land) and
// wakes the run if it is parked. A decision for a step the run has not
// reached yet is kept in the journal and applied when it gets there.
//
// Errors: *InputError, eventstore.ErrRunNotFound, ErrRunFinished,
// ErrNotWaiting (not an approval step, or already decided). Nothing is
// written when it fails.
func Approve(ctx context.Context, store *eventstore.Store, req ApproveRequest) error {
	if err := event.ValidateRunID(req.RunID); err != nil {
		return &InputError{Field: "run_id", Msg: err.Error()}
	}
	if req.StepID == "" {
		return &InputError{Field: "step_id", Msg: "required"}
	}
	if req.Approver == "" {
		return &InputError{Field: "approver", Msg: "required: say who decides"}
	}
	for tries := 0; ; tries++ {
		evs, head, err := store.Read(ctx, req.RunID)
		if err != nil {
			return err
		}
		st, err := engine.Fold(evs)
		if err != nil {
			return fmt.Errorf("approving in run %s: %w", req.RunID, err)
		}
		if st.Status.Terminal() {
			return fmt.Errorf("approving step %s of run %s: %w (%s)", req.StepID, req.RunID, ErrRunFinished, st.Status)
		}
		var node *workflow.Node
		if st.Workflow != nil {
			node, _ = engine.NodeForStep(st.Workflow, req.StepID)
		}
		if node == nil || node.Type != workflow.TypeApproval {
			return fmt.Errorf("approving step %s of run %s: %w: it is not an approval step", req.StepID, req.RunID, ErrNotWaiting)
		}
		if d, ok := st.Decisions[req.StepID]; ok {
			return fmt.Errorf("approving step %s of run %s: %w: %s decided already (%s)", req.StepID, req.RunID, ErrNotWaiting, d.Approver, d.Decision)
		}
		if s, ok := st.Steps[req.StepID]; ok && s.Status == engine.StepCompleted {
			return fmt.Errorf("approving step %s of run %s: %w: the step is complete", req.StepID, req.RunID, ErrNotWaiting)
		}
		if d, err := node.Approval(); err == nil && len(d.Approvers) > 0 && !slices.Contains(d.Approvers, req.Approver) {
			return &InputError{Field: "approver", Msg: fmt.Sprintf("%q may not decide step %s (approvers: %s)", req.Approver, req.StepID, strings.Join(d.Approvers, ", "))}
		}
		decision := event.DecisionReject
		if req.Approve {
			decision = event.DecisionApprove
		}
		ev := event.MustNew(event.ApprovalReceived, req.StepID, 0, event.ApprovalReceivedData{
			Decision: decision, Approver: req.Approver, Comment: req.Comment})
		ev.WorkerID = req.Approver
		_, err = store.Append(ctx, req.RunID, head, ev)
		if errors.Is(err, eventstore.ErrConflict) && tries < 10 {
			continue
		}
		if err != nil {
			return fmt.Errorf("approving step %s of run %s: %w", req.StepID, req.RunID, err)
		}
		if st.Status == engine.StatusWaiting {
			return store.Enqueue(ctx, req.RunID, "approve")
		}
		return nil
	}
}

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// Signal delivers a named signal to a run waiting for it. No node type
// waits for signals yet, so every signal is refused with ErrNotWaiting
// after its run is checked; nothing is written.
func Signal(ctx context.Context, store *eventstore.Store, runID, name string, payload json.RawMessage) error {
	if err := event.ValidateRunID(runID); err != nil {
		return &InputError{Field: "run_id", Msg: err.Error()}
	}
	if name == "" {
		return &InputError{Field: "name", Msg: "required"}
	}
	evs, _, err := store.Read(ctx, runID)
	if err != nil {
		return err
	}
	st, err := engine.Fold(evs)
	if err != nil {
		return fmt.Errorf("signalling run %s: %w", runID, err)
	}
	if st.Status.Terminal() {
		return fmt.Errorf("signalling run %s: %w (%s)", runID, ErrRunFinished, st.Status)
	}
	return fmt.Errorf("signalling run %s: %w: no step waits for signal %q", runID, ErrNotWaiting, name)
}
