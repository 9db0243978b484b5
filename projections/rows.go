package projections

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"time"
	"unicode/utf8"

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
	Error        string
	ErrorCode    string
	FailedStep   string
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
	CostUSD      float64
	CostUnknown  bool
	Delivery     string
	StartedAt    time.Time
	EndedAt      time.Time
	DurationMs   int64
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

// journalRow is a row of journal_events.
type journalRow struct {
	RunID     string
	Seq       uint64
	Kind      string
	StepID    string
	Attempt   int
	WorkerID  string
	Data      json.RawMessage
	StreamSeq uint64
	TS        time.Time
}

func journalRowOf(ev event.Event, streamSeq uint64) journalRow {
	return journalRow{
		RunID: ev.RunID, Seq: ev.Seq, Kind: string(ev.Kind), StepID: ev.StepID, Attempt: ev.Attempt,
		WorkerID: ev.WorkerID, Data: ev.Data, StreamSeq: streamSeq, TS: ev.TS,
	}
}

// runRowOf maps a folded run to its runs row. withBlobs includes the
// workflow snapshot and the input, which never change after run_created;
// without them the upsert keeps the stored ones.
func runRowOf(st *engine.RunState, withBlobs bool) RunRow {
	r := RunRow{
		RunID:        st.RunID,
		Status:       st.Status,
		WorkflowName: st.Created.WorkflowName,
		WorkflowHash: st.Created.WorkflowHash,
		Output:       st.Output,
		ParentRunID:  st.Created.ParentRunID,
		ParentStepID: st.Created.ParentStepID,
		Depth:        st.Created.Depth,
		CostUSD:      st.Usage.CostUSD,
		CostUnknown:  st.Usage.CostUnknown,
		InputTokens:  st.Usage.InputTokens,
		OutputTokens: st.Usage.OutputTokens,
		TotalTokens:  st.Usage.TotalTokens,
		Error:        st.Error,
		ErrorCode:    st.ErrorCode,
		FailedStep:   st.FailedStep,
		Resumes:      st.Resumes,
		LastWorker:   st.LastWorker,
		CreatedAt:    st.CreatedAt,
		UpdatedAt:    st.UpdatedAt,
		EndedAt:      st.EndedAt,
		LastSeq:      st.LastSeq,
		StepsSpent:   st.StepsStarted,
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
			steps = append(steps, stepRowOf(st.RunID, s, a))
		}
	}
	return runRowOf(st, true), steps
}

// stepRowOf maps one attempt of a folded step to its steps row.
func stepRowOf(runID string, s *engine.Step, a *engine.Attempt) StepRow {
	r := StepRow{
		RunID: runID, StepID: s.ID, Attempt: a.Attempt, NodeID: s.NodeID, NodeType: s.NodeType,
		Status: a.Status, Input: a.Input, Output: a.Output, Error: a.Error, ErrorClass: a.Class,
		IdempotencyKey: a.Key, Tries: a.Tries, Delivery: a.Delivery,
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
		r.CostUnknown = a.Usage.CostUnknown
	}
	return r
}

// receiptRowOf maps a claimed attempt to its receipt row.
func receiptRowOf(runID string, s *engine.Step, a *engine.Attempt) ReceiptRow {
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

// Postgres refuses some values that JSON and Go strings allow: a NUL
// character in text or jsonb, a lone UTF-16 surrogate in jsonb, invalid
// UTF-8 anywhere. A journal event carrying one (an LLM's output, say) must
// not stop the projector, so such values are stored with U+FFFD in place of
// the offending character. Everything else is stored as the journal has it.

// cleanText returns s as a Postgres text value accepts it.
func cleanText(s string) string {
	if strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// cleanJSON returns raw as a Postgres jsonb value accepts it, or nil for an
// absent value.
func cleanJSON(raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return nil
	}
	if utf8.Valid(raw) && !hasBadEscape(raw) {
		return raw
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		// Not JSON at all (the envelope decoder would not let this
		// through): keep it as a string.
		v = string(raw)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(scrub(v)); err != nil {
		return []byte("null")
	}
	return bytes.TrimRight(buf.Bytes(), "\n")
}

// scrub replaces NUL characters and invalid UTF-8 in every string and key
// of a decoded JSON value (decoding already turned lone surrogates into
// U+FFFD).
func scrub(v any) any {
	switch x := v.(type) {
	case string:
		return cleanText(x)
	case []any:
		for i := range x {
			x[i] = scrub(x[i])
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[cleanText(k)] = scrub(e)
		}
		return out
	default:
		return v
	}
}

// hasBadEscape reports whether raw holds a \u escape that jsonb refuses or
// may refuse: \u0000 or a UTF-16 surrogate (valid pairs are rewritten as
// the character they encode, which is the same value).
func hasBadEscape(raw []byte) bool {
	for i := 0; i+5 < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if raw[i+1] != 'u' {
			i++ // skip the escaped character (it may be a backslash)
			continue
		}
		var n rune
		for _, c := range raw[i+2 : i+6] {
			n <<= 4
			switch {
			case c >= '0' && c <= '9':
				n |= rune(c - '0')
			case c >= 'a' && c <= 'f':
				n |= rune(c - 'a' + 10)
			case c >= 'A' && c <= 'F':
				n |= rune(c - 'A' + 10)
			default:
				return true // not an escape JSON allows; let the slow path decide
			}
		}
		if n == 0 || (n >= 0xD800 && n <= 0xDFFF) {
			return true
		}
		i += 5
	}
	return false
}

// int32Of clamps n into an integer column's range.
func int32Of(n int) int32 {
	return int32(max(min(n, math.MaxInt32), math.MinInt32))
}

// fitsInt32 reports whether n fits an integer column without clamping.
func fitsInt32(n int) bool { return n >= math.MinInt32 && n <= math.MaxInt32 }
