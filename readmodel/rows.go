package readmodel

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// RunRow is a row of the runs table: a run's state folded from its journal
// up to LastSeq.
type RunRow struct {
	RunID        string
	Status       engine.Status
	WorkflowName string
	// Workflow is the workflow snapshot; ListRuns leaves it nil.
	Workflow     json.RawMessage
	WorkflowHash string
	Input        json.RawMessage
	Output       json.RawMessage
	ParentRunID  string
	ParentStepID string
	Depth        int
	CostUSD      float64
	// CostUnknown: a step used a model the price table does not know.
	CostUnknown  bool
	InputTokens  int64
	OutputTokens int64
	TotalTokens  int64
	// CacheReadTokens and CacheWriteTokens are parts of InputTokens,
	// ReasoningTokens of OutputTokens.
	CacheReadTokens  int64
	CacheWriteTokens int64
	ReasoningTokens  int64
	Error            string
	ErrorCode        string
	FailedStep       string
	// Resumes counts the drives of the run (run_resumed events).
	Resumes    int
	LastWorker string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	// EndedAt is zero while the run has not ended.
	EndedAt time.Time
	LastSeq uint64
	// Budget is the effective budget (event.Budget JSON), nil if none;
	// StepsSpent the acting steps started; PausedOn the brake the run
	// is paused on (budget, anomaly), or "".
	Budget     json.RawMessage
	StepsSpent int64
	PausedOn   string
	// JournalRemovedAt is when retention removed the run's journal
	// (PAL_RETENTION); zero while it has one. Only the read side sets it:
	// the fold never does.
	JournalRemovedAt time.Time
	// ForkedFrom is a fork's source ({run_id, step_id, seq}: run_created's
	// forked_from without its copies), nil for a run that is no fork.
	ForkedFrom json.RawMessage
	// Labels are run_created's labels; empty for none.
	Labels map[string]string
	// Queue is the run's work queue (event.DefaultQueue unless its
	// run_created names another).
	Queue string
	// Schedule and Tick are run_created's schedule and tick: the schedule
	// that started the run and the tick it was for; empty and zero for a
	// run no schedule started.
	Schedule string
	Tick     time.Time
	// Thread is run_created's thread; "" for none.
	Thread string
}

// StepRow is a row of the steps table: one attempt of one step.
type StepRow struct {
	RunID          string
	StepID         string
	Attempt        int
	NodeID         string
	NodeType       string
	Status         engine.StepStatus
	Input          json.RawMessage
	Output         json.RawMessage
	Error          string
	ErrorClass     string
	IdempotencyKey string
	// Tries counts the tries of this attempt: a retry whose outcome was
	// unknown keeps the attempt (and its key).
	Tries        int
	InputTokens  int64
	OutputTokens int64
	// CacheReadTokens and CacheWriteTokens are parts of InputTokens,
	// ReasoningTokens of OutputTokens.
	CacheReadTokens  int64
	CacheWriteTokens int64
	ReasoningTokens  int64
	CostUSD          float64
	CostUnknown      bool
	// Model is the provider/model an LLM attempt called, "" for other
	// steps.
	Model      string
	Delivery   string
	StartedAt  time.Time
	EndedAt    time.Time
	DurationMs int64
	// FirstSeq is the seq of the attempt's first event: the journal order.
	FirstSeq uint64
	// WaitingAt is when the attempt began to wait; zero if it never did.
	WaitingAt time.Time
	// Substeps is the JSON array of the sub-steps a process step's child
	// reported ([]engine.Substep); nil when it reported none.
	Substeps json.RawMessage
	// CopiedFrom is a step a fork copied from its source instead of
	// running it (event.CopiedFrom JSON), nil for one that ran.
	CopiedFrom json.RawMessage
	LastSeq    uint64
}

// Receipt statuses (side_effect_receipts.status).
const (
	// ReceiptClaimed: the delivery was claimed and its attempt has not
	// ended; it may be in flight.
	ReceiptClaimed = "claimed"
	// ReceiptDelivered: the receiver acknowledged the delivery.
	ReceiptDelivered = "delivered"
	// ReceiptUnconfirmed: the attempt ended without a confirmation and its
	// outcome is unknown (a crash between dispatch and confirmation, a
	// timeout, a cut connection). PAL does not send it again.
	ReceiptUnconfirmed = "unconfirmed"
	// ReceiptFailed: the receiver answered with an error (the attempt
	// failed definitely); the delivery did not happen.
	ReceiptFailed = "failed"
)

// ReceiptRow is a row of side_effect_receipts: the claimed delivery of one
// step attempt.
type ReceiptRow struct {
	RunID          string
	StepID         string
	Attempt        int
	IdempotencyKey string
	Connector      string
	Target         string
	Status         string
	// HTTPStatus is the receiver's status once delivered, else 0.
	HTTPStatus  int
	ClaimedAt   time.Time
	DeliveredAt time.Time
	LastSeq     uint64
}

// RunRowOf maps a folded run to its runs row. withBlobs includes the
// workflow snapshot and the input, which never change after run_created;
// without them the upsert keeps the stored ones.
func RunRowOf(st *engine.RunState, withBlobs bool) RunRow {
	r := RunRow{
		RunID:            st.RunID,
		Status:           st.Status,
		WorkflowName:     st.Created.WorkflowName,
		WorkflowHash:     st.Created.WorkflowHash,
		Output:           st.Output,
		ParentRunID:      st.Created.ParentRunID,
		ParentStepID:     st.Created.ParentStepID,
		Depth:            st.Created.Depth,
		CostUSD:          st.Usage.CostUSD,
		CostUnknown:      st.Usage.CostUnknown,
		InputTokens:      st.Usage.InputTokens,
		OutputTokens:     st.Usage.OutputTokens,
		TotalTokens:      st.Usage.TotalTokens,
		CacheReadTokens:  st.Usage.CacheReadTokens,
		CacheWriteTokens: st.Usage.CacheWriteTokens,
		ReasoningTokens:  st.Usage.ReasoningTokens,
		Error:            st.Error,
		ErrorCode:        st.ErrorCode,
		FailedStep:       st.FailedStep,
		Resumes:          st.Resumes,
		LastWorker:       st.LastWorker,
		CreatedAt:        st.CreatedAt,
		UpdatedAt:        st.UpdatedAt,
		EndedAt:          st.EndedAt,
		LastSeq:          st.LastSeq,
		StepsSpent:       st.StepsStarted,
		Labels:           st.Created.Labels,
		Queue:            event.QueueOr(st.Created.Queue),
		Schedule:         st.Created.Schedule,
		Tick:             tickOf(st.Created.Tick),
		Thread:           st.Created.Thread,
	}
	if st.Budget != nil {
		r.Budget, _ = json.Marshal(st.Budget)
	}
	if f := st.Created.ForkedFrom; f != nil {
		// Without its copies (and reruns): those are the steps' rows.
		r.ForkedFrom, _ = json.Marshal(event.ForkedFrom{RunID: f.RunID, StepID: f.StepID, Seq: f.Seq})
	}
	if st.Pause != nil && !st.Status.Terminal() {
		r.PausedOn = st.Pause.Reason
	}
	if withBlobs {
		r.Workflow, r.Input = st.Created.Workflow, st.Created.Input
	}
	return r
}

// RowsOf maps a folded run to the rows the projector writes for it: its
// runs row (with the workflow snapshot and input) and one steps row per
// attempt, steps in the order they first appear in the journal. The read
// model renders a run from these rows whichever source they come from.
func RowsOf(st *engine.RunState) (RunRow, []StepRow) {
	var steps []StepRow
	for _, id := range st.Order {
		s := st.Steps[id]
		for _, a := range s.Attempts {
			steps = append(steps, StepRowOf(st.RunID, s, a))
		}
	}
	return RunRowOf(st, true), steps
}

// StepRowOf maps one attempt of a folded step to its steps row.
func StepRowOf(runID string, s *engine.Step, a *engine.Attempt) StepRow {
	r := StepRow{
		RunID: runID, StepID: s.ID, Attempt: a.Attempt, NodeID: s.NodeID, NodeType: s.NodeType,
		Status: a.Status, Input: a.Input, Output: a.Output, Error: a.Error, ErrorClass: a.Class,
		IdempotencyKey: a.Key, Tries: a.Tries, Delivery: a.Delivery, Model: a.Model,
		StartedAt: a.StartedAt, EndedAt: a.EndedAt, DurationMs: a.DurationMs, LastSeq: a.LastSeq,
		FirstSeq: a.FirstSeq, WaitingAt: a.WaitingAt,
	}
	if len(a.Substeps) > 0 {
		r.Substeps, _ = json.Marshal(a.Substeps) // strings and raw JSON from the journal: always marshals
	}
	if s.CopiedFrom != nil {
		r.CopiedFrom, _ = json.Marshal(s.CopiedFrom)
	}
	if a.Usage != nil {
		r.InputTokens, r.OutputTokens, r.CostUSD = a.Usage.InputTokens, a.Usage.OutputTokens, a.Usage.CostUSD
		r.CacheReadTokens, r.CacheWriteTokens, r.ReasoningTokens = a.Usage.CacheReadTokens, a.Usage.CacheWriteTokens, a.Usage.ReasoningTokens
		r.CostUnknown = a.Usage.CostUnknown
	}
	return r
}

// ReceiptRowOf maps a claimed attempt to its receipt row.
func ReceiptRowOf(runID string, s *engine.Step, a *engine.Attempt) ReceiptRow {
	return ReceiptRow{
		RunID: runID, StepID: s.ID, Attempt: a.Attempt, IdempotencyKey: a.Key,
		Connector: a.Connector, Target: a.Target, Status: ReceiptStatus(a),
		HTTPStatus: a.DeliveryStatus, ClaimedAt: a.ClaimedAt, DeliveredAt: a.DeliveredAt, LastSeq: a.LastSeq,
	}
}

// ReceiptStatus says where the claimed delivery of attempt a stands: one of
// the Receipt* statuses.
func ReceiptStatus(a *engine.Attempt) string {
	switch {
	case a.Delivered:
		return ReceiptDelivered
	case a.Failed:
		return ReceiptFailed
	case a.Status == engine.StepCompleted || a.Status == engine.StepFailed || a.Status == engine.StepRetried:
		return ReceiptUnconfirmed
	default:
		return ReceiptClaimed
	}
}

// RunDetail is a run with its step attempts.
type RunDetail struct {
	Run RunRow
	// Steps holds every attempt of every step, in the order they started.
	Steps []StepRow
}

// ErrBadCursor is a listing cursor that Cursor did not make.
var ErrBadCursor = errors.New("invalid cursor")

// Cursor returns the position of r in a listing, for RunFilter.Before.
func (r RunRow) Cursor() string {
	return base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%d|%s", r.CreatedAt.UnixMicro(), r.RunID))
}

// Cursor times are bounded to years 1 to 9999, well inside what Postgres
// and pgx take as a timestamptz: a cursor outside them is not one
// ListRuns issued, and must not reach the database as a time it refuses.
var (
	minCursorTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	maxCursorTime = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).UnixMicro()
)

// ParseCursor takes a cursor Cursor made: anything else, including a run
// id that is no run id (a NUL byte or invalid UTF-8 would reach Postgres,
// which refuses it as text), is ErrBadCursor.
func ParseCursor(c string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", ErrBadCursor
	}
	ts, id, ok := strings.Cut(string(raw), "|")
	if !ok || event.ValidateRunID(id) != nil {
		return time.Time{}, "", ErrBadCursor
	}
	us, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || us < minCursorTime || us > maxCursorTime {
		return time.Time{}, "", ErrBadCursor
	}
	return time.UnixMicro(us), id, nil
}

// tickOf reads run_created's tick (RFC 3339); zero for none or one that
// does not parse.
func tickOf(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t.UTC()
}
