package runs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/readmodel"
	"github.com/palrun/pal/workflow"
)

// Waterfall is the timeline of one run, as the web UI's waterfall draws
// it (GET /v1/runs/{id}/waterfall): every step attempt as a segment on a
// time axis, waits as spans, drives and notable events as markers. It is
// computed on the server from the fold of the journal, so the browser only
// draws. Times are milliseconds from the run's creation (run_created).
type Waterfall struct {
	RunID       string        `json:"run_id"`
	Status      engine.Status `json:"status"`
	Workflow    string        `json:"workflow,omitempty"`
	ParentRunID string        `json:"parent_run_id,omitempty"`
	// ForkedFrom is the run and step a fork started from.
	ForkedFrom *ForkPoint  `json:"forked_from,omitempty"`
	Error      string      `json:"error,omitempty"`
	Usage      event.Usage `json:"usage"`
	LastSeq    uint64      `json:"last_seq"`
	CreatedAt  string      `json:"created_at"`
	EndedAt    string      `json:"ended_at,omitempty"`
	// SpanMs is the length of the axis: to the run's end, or to the time
	// the waterfall was computed while the run is in flight. Open
	// segments and waits end there (with Open set).
	SpanMs float64 `json:"span_ms"`
	// Rows are the steps in tree order: each step is followed by the
	// steps nested in it (loop iterations, agent turns and tool calls),
	// and siblings keep journal order (a loop or an agent, journaled when
	// it ends, takes the place of its first nested step).
	Rows   []WaterfallRow `json:"rows"`
	Drives []Drive        `json:"drives"`
	Marks  []Mark         `json:"marks"`
	// Lanes is how many lanes the lane view has: the most steps that
	// were in flight at once (readmodel.Lanes); each row says its Lane.
	Lanes int `json:"lanes"`
	// Graph is the run's workflow, each node with its outcome (GraphOf),
	// for the graph tab; absent for a plain LLM run.
	Graph *Graph `json:"graph,omitempty"`
}

// WaterfallRow is one step of a Waterfall.
type WaterfallRow struct {
	StepID string `json:"step_id"`
	// Parent is the step this one is nested in ("" at the top level);
	// Depth counts the steps above it; Children the steps directly in it.
	Parent   string `json:"parent,omitempty"`
	Depth    int    `json:"depth"`
	Children int    `json:"children"`
	// Lane is the row's lane in the lane view, from 0: steps that ran at
	// once are in lanes of their own (readmodel.Lanes), over the step's
	// whole time, its first attempt's start to its last one's end; -1
	// for a step that has no segment.
	Lane     int    `json:"lane"`
	NodeType string `json:"node_type,omitempty"`
	// Tool is the tool a tool call of an agent called (its node type
	// is the agent's): the UI labels the row by it.
	Tool string `json:"tool,omitempty"`
	// Status is the latest attempt's (running, waiting, retrying,
	// completed, failed), or interrupted: the step was in flight
	// (running, waiting or retrying) when the run ended. A row standing
	// for a loop or an agent not journaled yet is running (interrupted
	// once the run ended).
	Status   engine.StepStatus `json:"status"`
	Retries  int               `json:"retries"`
	Segments []Segment         `json:"segments"`
	// The latest attempt's key, input (as rendered), output, error and
	// delivery; Usage sums every attempt.
	Key    string          `json:"idempotency_key,omitempty"`
	Input  json.RawMessage `json:"input,omitempty"`
	Output json.RawMessage `json:"output,omitempty"`
	Error  string          `json:"error,omitempty"`
	Class  string          `json:"class,omitempty"`
	Usage  *event.Usage    `json:"usage,omitempty"`
	// Model is the provider/model the latest attempt of an LLM step
	// called: the one that answered, once it completed.
	Model      string   `json:"model,omitempty"`
	Delivery   string   `json:"delivery,omitempty"`
	Receipt    *Receipt `json:"receipt,omitempty"`
	ChildRunID string   `json:"child_run_id,omitempty"`
	// CopiedFrom marks a step a fork copied from its source run.
	CopiedFrom *event.CopiedFrom `json:"copied_from,omitempty"`
	// WaitReason is set while the step waits (approval, child, signal).
	WaitReason string `json:"wait_reason,omitempty"`
	// Approval is the rendered prompt and the approvers of an approval
	// step.
	Approval *engine.ApprovalInput `json:"approval,omitempty"`
}

// Segment is one attempt of a step: a bar from its start to its end,
// coloured by Outcome (running, waiting, completed, failed, retried:
// failed and followed by a journaled retry, or interrupted: not ended
// when the run ended, so it ends at the run's end). The gap before the next
// segment is the retry's backoff. An attempt retried with its outcome
// unknown keeps its number (and key), so one segment may span several
// Tries. Attempt 0 is no attempt: the span of the steps nested in a
// loop or an agent not journaled yet (spanRows).
type Segment struct {
	Attempt int     `json:"attempt"`
	Tries   int     `json:"tries"`
	Outcome string  `json:"outcome"`
	StartMs float64 `json:"start_ms"`
	EndMs   float64 `json:"end_ms"`
	Open    bool    `json:"open,omitempty"`
	Error   string  `json:"error,omitempty"`
	// Model is the provider/model an LLM attempt called.
	Model string `json:"model,omitempty"`
	// Wait is the part of the attempt spent waiting, when it waited.
	Wait *Wait `json:"wait,omitempty"`
}

// Wait is a span during which a step waited for outside input.
type Wait struct {
	Reason  string  `json:"reason,omitempty"`
	StartMs float64 `json:"start_ms"`
	EndMs   float64 `json:"end_ms"`
	Open    bool    `json:"open,omitempty"`
}

// Receipt is the claimed delivery of a step's latest attempt.
type Receipt struct {
	Connector  string `json:"connector,omitempty"`
	Target     string `json:"target,omitempty"`
	Status     string `json:"status"`
	HTTPStatus int    `json:"http_status,omitempty"`
}

// Drive is one run_resumed: a worker taking the run over. Interrupted
// reports that the drive before it ended without finishing or parking
// the run.
type Drive struct {
	Seq         uint64  `json:"seq"`
	AtMs        float64 `json:"at_ms"`
	Worker      string  `json:"worker"`
	Count       int     `json:"count"`
	Interrupted bool    `json:"interrupted"`
}

// Mark is a journal event drawn as a marker on the axis: anomalies,
// budget warnings, confidence gates, approvals received, a cancel. Data
// is the event's payload as journaled.
type Mark struct {
	Seq    uint64          `json:"seq"`
	AtMs   float64         `json:"at_ms"`
	Kind   event.Kind      `json:"kind"`
	StepID string          `json:"step_id,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"`
}

// StepInterrupted is the status of a step, and the outcome of an
// attempt, that was in flight when its run ended (cancelled, failed):
// the read model (RunView, the waterfall) says it, the journal has no
// event for it.
const StepInterrupted engine.StepStatus = "interrupted"

// markKinds are the kinds drawn as marks. The budget kinds are named by
// their journal names so they show as soon as workers write them.
var markKinds = map[event.Kind]bool{
	event.AnomalyDetected: true, "budget_warning": true, "budget_exceeded": true,
	event.ConfidenceEvaluated: true, event.ConfidenceGateBypassed: true,
	event.ApprovalReceived: true, event.RunCancelled: true, event.RunFailed: true,
}

// WaterfallOf computes the waterfall of a journal and its fold; now ends
// the axis of a run in flight.
func WaterfallOf(evs []event.Event, st *engine.RunState, now time.Time) *Waterfall {
	t0 := st.CreatedAt
	end := now
	if !st.EndedAt.IsZero() {
		end = st.EndedAt
	}
	if end.Before(t0) {
		end = t0
	}
	ms := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return math.Round(float64(t.Sub(t0).Microseconds())) / 1000
	}
	w := &Waterfall{RunID: st.RunID, Status: st.Status, Workflow: st.Created.WorkflowName,
		ParentRunID: st.Created.ParentRunID, Error: st.Error, Usage: st.Usage, LastSeq: st.LastSeq,
		CreatedAt: FormatTime(st.CreatedAt), EndedAt: FormatTime(st.EndedAt), SpanMs: ms(end),
		Rows: []WaterfallRow{}, Drives: []Drive{}, Marks: []Mark{}}
	if f := st.Created.ForkedFrom; f != nil {
		w.ForkedFrom = &ForkPoint{RunID: f.RunID, StepID: f.StepID, Seq: f.Seq}
	}

	// The journal gives what the fold does not keep: each drive, the
	// marks, and why each attempt waited.
	type stepAttempt struct {
		step    string
		attempt int
	}
	reasons := map[stepAttempt]string{}
	subs := map[string]*substepBars{} // a process step's sub-steps, from their events
	for _, ev := range evs {
		switch {
		case ev.Kind == event.SubstepStarted || ev.Kind == event.SubstepCompleted:
			var d event.SubstepStartedData // substep_completed's name too
			if ev.DecodeData(&d) == nil && d.Name != "" {
				b := subs[ev.StepID]
				if b == nil {
					b = &substepBars{}
					subs[ev.StepID] = b
				}
				b.add(d.Name, max(ev.Attempt, 1), ms(ev.TS), ev.Kind == event.SubstepCompleted)
			}
		case ev.Kind == event.RunResumed:
			var d event.RunResumedData
			if ev.DecodeData(&d) == nil {
				w.Drives = append(w.Drives, Drive{Seq: ev.Seq, AtMs: ms(ev.TS), Worker: d.Worker, Count: d.ResumeCount, Interrupted: d.Crashed})
			}
		case ev.Kind == event.StepWaiting:
			var d event.StepWaitingData
			if ev.DecodeData(&d) == nil {
				reasons[stepAttempt{ev.StepID, max(ev.Attempt, 1)}] = d.Reason
			}
		case markKinds[ev.Kind]:
			w.Marks = append(w.Marks, Mark{Seq: ev.Seq, AtMs: ms(ev.TS), Kind: ev.Kind, StepID: ev.StepID, Data: ev.Data})
		}
	}

	// Nesting: a step's parent is the nearest step above it in its id
	// (ask.turn[2].tool[0] → ask.turn[2] → ask; each[3].fetch → each).
	// A loop or an agent journals its own step only when it ends: it
	// takes its place just before its first nested step, and until it is
	// journaled a row stands for it (pending, by its node type).
	pending := map[string]string{}
	has := func(id string) bool { return st.Steps[id] != nil || pending[id] != "" }
	order := make([]string, 0, len(st.Order))
	placed := map[string]bool{}
	for _, id := range st.Order {
		var above []string
		for p, typ := aboveStep(id); p != "" && !placed[p]; p, typ = aboveStep(p) {
			placed[p] = true
			if st.Steps[p] == nil {
				pending[p] = typ
			}
			above = append(above, p)
		}
		for i := len(above) - 1; i >= 0; i-- {
			order = append(order, above[i])
		}
		if !placed[id] {
			placed[id] = true
			order = append(order, id)
		}
	}
	children := map[string][]string{}
	parents := map[string]string{}
	var top []string
	for _, id := range order {
		p := parentStep(id, has)
		parents[id] = p
		if p == "" {
			top = append(top, id)
		} else {
			children[p] = append(children[p], id)
		}
	}
	var walk func(id string, depth int)
	runEnded := !st.EndedAt.IsZero()
	walk = func(id string, depth int) {
		s := st.Steps[id]
		if s == nil { // a loop or agent not journaled yet: spanRows draws it
			w.Rows = append(w.Rows, WaterfallRow{StepID: id, Parent: parents[id], Depth: depth, Children: len(children[id]),
				NodeType: pending[id], Status: engine.StepRunning, Segments: []Segment{}})
			for _, c := range children[id] {
				walk(c, depth+1)
			}
			return
		}
		row := WaterfallRow{StepID: id, Parent: parents[id], Depth: depth, Children: len(children[id]),
			NodeType: s.NodeType, Status: stepStatus(s.Status), Retries: s.Retries, Key: s.Key,
			Input: s.Input, Output: s.Output, Error: s.Error, Class: s.Class, Delivery: s.Delivery,
			ChildRunID: s.ChildRunID, CopiedFrom: s.CopiedFrom, WaitReason: s.WaitReason, Segments: make([]Segment, 0, len(s.Attempts))}
		if s.Status != engine.StepWaiting {
			row.WaitReason = ""
		}
		if sid, err := engine.ParseStepID(id); err == nil && sid.Kind == engine.StepOfToolCall {
			var in engine.ToolInput
			if json.Unmarshal(s.Input, &in) == nil {
				row.Tool = in.Tool
			}
		}
		if runEnded && inFlight(row.Status) {
			row.Status, row.WaitReason = StepInterrupted, ""
		}
		var usage event.Usage
		for _, a := range s.Attempts {
			if a.Usage != nil {
				usage.Add(*a.Usage)
			}
			seg := segmentOf(a, reasons[stepAttempt{id, a.Attempt}], ms, ms(end))
			if runEnded && seg.Open {
				seg.Outcome, seg.Open = string(StepInterrupted), false
				if seg.Wait != nil {
					seg.Wait.Open = false
				}
			}
			row.Segments = append(row.Segments, seg)
		}
		if usage != (event.Usage{}) {
			row.Usage = &usage
		}
		if a := s.AttemptState(s.Attempt); a != nil {
			row.Model = a.Model
		}
		if a := s.AttemptState(s.Attempt); a != nil && a.Claimed {
			row.Receipt = &Receipt{Connector: a.Connector, Target: a.Target, Status: readmodel.ReceiptStatus(a), HTTPStatus: a.DeliveryStatus}
		}
		if s.NodeType == workflow.TypeApproval {
			var ai engine.ApprovalInput
			if json.Unmarshal(s.Input, &ai) == nil {
				row.Approval = &ai
			}
		}
		if b := subs[id]; b != nil && s.NodeType == workflow.TypeProcess {
			w.Rows = append(w.Rows, row)
			w.Rows[len(w.Rows)-1].Children += len(b.names)
			w.Rows = append(w.Rows, b.rows(id, depth+1, runEnded || row.Status != engine.StepRunning, stepEnd(row, ms(end)))...)
		} else {
			w.Rows = append(w.Rows, row)
		}
		for _, c := range children[id] {
			walk(c, depth+1)
		}
	}
	for _, id := range top {
		walk(id, 0)
	}
	w.Lanes = laneRows(w.Rows)
	spanRows(w.Rows, runEnded, ms(end))
	w.Graph = GraphOf(st.Workflow, w.Rows)
	return w
}

// spanRows makes each loop's and agent's row span the steps nested in
// it: its bar starts no later than the first of them (its own
// step_started is journaled when it ends), and a row standing for one
// not journaled yet gets a bar from there to endMs (attempt 0), running,
// or interrupted once the run ended. Lanes are laid out before, over the
// steps' own attempts.
func spanRows(rows []WaterfallRow, runEnded bool, endMs float64) {
	for i := range rows {
		r := &rows[i]
		if r.Children == 0 || (r.NodeType != workflow.TypeLoop && r.NodeType != workflow.TypeAgent) {
			continue
		}
		first := math.Inf(1)
		for j := i + 1; j < len(rows) && rows[j].Depth > r.Depth; j++ {
			if segs := rows[j].Segments; len(segs) > 0 {
				first = min(first, segs[0].StartMs)
			}
		}
		if math.IsInf(first, 1) {
			continue
		}
		if len(r.Segments) == 0 {
			seg := Segment{Outcome: string(engine.StepRunning), StartMs: first, EndMs: endMs, Open: !runEnded}
			if runEnded {
				seg.Outcome, r.Status = string(StepInterrupted), StepInterrupted
			}
			r.Segments = append(r.Segments, seg)
		} else if first < r.Segments[0].StartMs {
			r.Segments[0].StartMs = first
		}
	}
}

// inFlight reports whether a step of this status has not ended.
func inFlight(s engine.StepStatus) bool {
	return s == engine.StepRunning || s == engine.StepWaiting || s == engine.StepRetrying
}

// laneRows sets each row's Lane over its segments' whole span and
// returns how many lanes there are.
func laneRows(rows []WaterfallRow) int {
	var spans []readmodel.Span
	var of []int // spans[k] is rows[of[k]]
	for i := range rows {
		rows[i].Lane = -1
		segs := rows[i].Segments
		if len(segs) == 0 || rows[i].NodeType == SubstepRow {
			continue // a sub-step runs inside its process step's bar
		}
		last := segs[len(segs)-1]
		spans = append(spans, readmodel.Span{StartMs: segs[0].StartMs, EndMs: last.EndMs, Open: last.Open})
		of = append(of, i)
	}
	lanes, n := readmodel.Lanes(spans)
	for k, lane := range lanes {
		rows[of[k]].Lane = lane
	}
	return n
}

// stepEnd is where a step's bar ends: its last segment's end, or endMs.
func stepEnd(r WaterfallRow, endMs float64) float64 {
	if n := len(r.Segments); n > 0 && !r.Segments[n-1].Open {
		return r.Segments[n-1].EndMs
	}
	return endMs
}

// SubstepRow is the node type of a row that stands for a sub-step a
// process step reported (substep_started, substep_completed): nested in
// the step's row, its id "<step>/<name>", one segment per attempt that
// ran it. The lane view leaves such rows out.
const SubstepRow = "substep"

// substepBars are the sub-steps of one process step, in the order they
// first started, with a segment per attempt.
type substepBars struct {
	names []string
	segs  map[string][]Segment
}

// add notes a sub-step's start or end in attempt a at atMs.
func (b *substepBars) add(name string, a int, atMs float64, completed bool) {
	if b.segs == nil {
		b.segs = map[string][]Segment{}
	}
	segs := b.segs[name]
	if len(segs) == 0 {
		b.names = append(b.names, name)
	}
	if n := len(segs); n == 0 || segs[n-1].Attempt != a {
		segs = append(segs, Segment{Attempt: a, Tries: 1, Outcome: string(engine.StepRunning), StartMs: atMs, EndMs: atMs, Open: true})
	}
	last := &segs[len(segs)-1]
	if completed {
		last.Outcome, last.EndMs, last.Open = string(engine.StepCompleted), atMs, false
	}
	b.segs[name] = segs
}

// rows are the sub-steps' rows under step at depth; over (the step or the
// run ended) turns a sub-step still open interrupted, else it runs to
// nowMs.
func (b *substepBars) rows(step string, depth int, over bool, nowMs float64) []WaterfallRow {
	out := make([]WaterfallRow, 0, len(b.names))
	for _, name := range b.names {
		segs := b.segs[name]
		for i := range segs {
			switch {
			case !segs[i].Open:
			case i < len(segs)-1: // its attempt ended before it did
				segs[i].Outcome, segs[i].Open, segs[i].EndMs = string(StepInterrupted), false, max(segs[i].StartMs, segs[i+1].StartMs)
			case over:
				segs[i].Outcome, segs[i].Open, segs[i].EndMs = string(StepInterrupted), false, max(segs[i].StartMs, nowMs)
			default:
				segs[i].EndMs = max(segs[i].StartMs, nowMs)
			}
		}
		status := engine.StepStatus(segs[len(segs)-1].Outcome)
		out = append(out, WaterfallRow{StepID: step + "/" + name, Parent: step, Depth: depth, NodeType: SubstepRow,
			Status: status, Retries: len(segs) - 1, Segments: segs})
	}
	return out
}

// segmentOf draws one attempt; an attempt not ended ends at endMs, open.
func segmentOf(a *engine.Attempt, reason string, ms func(time.Time) float64, endMs float64) Segment {
	seg := Segment{Attempt: a.Attempt, Tries: a.Tries, Outcome: string(a.Status), Error: a.Error, Model: a.Model}
	start := a.StartedAt
	if start.IsZero() {
		start = a.WaitingAt
	}
	seg.StartMs = ms(start)
	seg.EndMs, seg.Open = endMs, true
	if !a.EndedAt.IsZero() {
		seg.EndMs, seg.Open = ms(a.EndedAt), false
	}
	if !a.WaitingAt.IsZero() {
		seg.Wait = &Wait{Reason: reason, StartMs: ms(a.WaitingAt), EndMs: seg.EndMs, Open: seg.Open}
	}
	return seg
}

// parentStep returns the nearest step above id that has, or "".
func parentStep(id string, has func(string) bool) string {
	for p, _ := aboveStep(id); p != ""; p, _ = aboveStep(p) {
		if has(p) {
			return p
		}
	}
	return ""
}

// aboveStep returns the step id one level above id and its node type: a
// tool call's turn, a turn's agent, a loop iteration's step's loop; ""
// at the top level.
func aboveStep(id string) (string, string) {
	sid, err := engine.ParseStepID(id)
	if err != nil {
		return "", ""
	}
	switch {
	case sid.Kind == engine.StepOfToolCall:
		sid.Kind = engine.StepOfTurn
		return sid.String(), workflow.TypeAgent
	case sid.Kind == engine.StepOfTurn:
		sid.Kind = engine.StepOfNode
		return sid.String(), workflow.TypeAgent
	case len(sid.Loops) > 0:
		last := sid.Loops[len(sid.Loops)-1]
		return engine.StepID{Loops: sid.Loops[:len(sid.Loops)-1], Node: last.Loop}.String(), workflow.TypeLoop
	}
	return "", ""
}

// Waterfall reads and folds a run and computes its waterfall. Errors:
// *InputError, ErrRunNotFound.
func (c *Client) Waterfall(ctx context.Context, runID string) (*Waterfall, error) {
	if err := checkRunID("run_id", runID); err != nil {
		return nil, err
	}
	evs, _, err := c.store.Read(ctx, runID)
	if err != nil && !errors.Is(err, event.ErrJournalCorrupt) {
		return nil, err
	}
	st, err := engine.FoldRead(evs, err)
	if err != nil {
		return nil, fmt.Errorf("reading run %s: %w", runID, err)
	}
	return WaterfallOf(evs, st, time.Now()), nil
}
