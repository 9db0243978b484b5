package runs

import (
	"bytes"
	"encoding/json"
	"slices"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/readmodel"
)

// RunView is the read model of one run: what GET /v1/runs/{id}, the NATS
// service's get, pal run get --json and the web UI show. It has two
// constructors, ViewOf (the fold of the journal) and ViewOfDetail (the
// Postgres projection), and both render through one function from the
// same rows, so a run reads the same from either source: one latest-
// attempt rule, one set of status names, one time format (TimeFormat).
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
	LastWorker   string          `json:"last_worker,omitempty"`
	LastSeq      uint64          `json:"last_seq"`
	CreatedAt    string          `json:"created_at"`
	UpdatedAt    string          `json:"updated_at"`
	EndedAt      string          `json:"ended_at,omitempty"`
	// Budget is the run's effective budget (its workflow's, narrowed at
	// start, plus every raise); absent when it has none. Spent is what
	// the run has spent against it, from the journal; PausedOn the brake
	// (budget, anomaly) the run waits on.
	Budget   *event.Budget `json:"budget,omitempty"`
	Spent    engine.Spend  `json:"spent"`
	PausedOn string        `json:"paused_on,omitempty"`
	// JournalRemovedAt is when retention (PAL_RETENTION) removed the
	// run's journal: the run is read from its Postgres rows, which stay.
	JournalRemovedAt string `json:"journal_removed_at,omitempty"`
	// ForkedFrom is the run and step a fork started from (pal run fork,
	// retry); absent for a run that is no fork.
	ForkedFrom *ForkPoint `json:"forked_from,omitempty"`
	// Labels are the start's labels (a fork's source's); absent for none.
	Labels map[string]string `json:"labels,omitempty"`
	// Queue is the work queue whose workers drive the run: a queued run
	// waits for one of them (pal worker --queues).
	Queue string `json:"queue"`
	// Schedule and Tick name the schedule that started the run and the
	// tick it was for; absent for a run no schedule started.
	Schedule string `json:"schedule,omitempty"`
	Tick     string `json:"tick,omitempty"`
	// Thread is the thread the run was started on (GET
	// /v1/threads/{id}); absent for none.
	Thread string     `json:"thread,omitempty"`
	Steps  []StepView `json:"steps"`
}

// StepView is one step of a RunView, as its latest attempt stands, with
// the times of the whole step.
type StepView struct {
	StepID   string            `json:"step_id"`
	NodeType string            `json:"node_type,omitempty"`
	Status   engine.StepStatus `json:"status"`
	// Attempt is the latest attempt's number; Attempts how many attempts
	// the step has had.
	Attempt  int    `json:"attempt"`
	Attempts int    `json:"attempts"`
	Key      string `json:"idempotency_key,omitempty"`
	// Input is the latest attempt's rendered input (an approval's prompt
	// and approvers, an LLM call's messages).
	Input    json.RawMessage `json:"input,omitempty"`
	Output   json.RawMessage `json:"output,omitempty"`
	Error    string          `json:"error,omitempty"`
	Delivery string          `json:"delivery,omitempty"`
	// StartedAt is the first attempt's start, EndedAt the latest
	// attempt's end (empty while the step has not ended).
	StartedAt string `json:"started_at,omitempty"`
	EndedAt   string `json:"ended_at,omitempty"`
	// DurationMs is EndedAt - StartedAt for an ended step, 0 before: the
	// wall time of the step, waits and retries included.
	DurationMs int64 `json:"duration_ms"`
	// WaitingSince is when the latest attempt began to wait (an
	// approval, a child run); WaitMs how long it waited, once it ended.
	WaitingSince string `json:"waiting_since,omitempty"`
	WaitMs       int64  `json:"wait_ms"`
	// Model is the provider/model the latest attempt of an LLM step
	// called: the one that answered, once it completed.
	Model string `json:"model,omitempty"`
	// Usage sums the tokens and cost of every attempt.
	Usage *event.Usage `json:"usage,omitempty"`
	// Models, for a step whose attempts called more than one model (a
	// fallback list), is each model's usage, in the order first called.
	Models []ModelUsage `json:"models,omitempty"`
	// Substeps are the sub-steps the latest attempt's process reported.
	Substeps []SubstepView `json:"substeps,omitempty"`
	// CopiedFrom marks a step a fork copied from its source run (the
	// source's step_completed seq) instead of running it.
	CopiedFrom *event.CopiedFrom `json:"copied_from,omitempty"`
}

// ModelUsage is what a step's attempts on one model spent.
type ModelUsage struct {
	Model    string      `json:"model"`
	Attempts int         `json:"attempts"`
	Usage    event.Usage `json:"usage"`
}

// SubstepView is one sub-step a process step's child reported.
type SubstepView struct {
	Name   string            `json:"name"`
	Status engine.StepStatus `json:"status"`
	Output json.RawMessage   `json:"output,omitempty"`
}

// TimeFormat is the read model's time format: RFC 3339 in UTC with
// microseconds, the precision Postgres keeps.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// FormatTime renders t in TimeFormat; the zero time is "".
func FormatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Truncate(time.Microsecond).Format(TimeFormat)
}

// ViewOf renders a folded run.
func ViewOf(st *engine.RunState) *RunView {
	run, steps := readmodel.RowsOf(st)
	return render(run, steps)
}

// ViewOfDetail renders a run read from the Postgres projection.
func ViewOfDetail(d readmodel.RunDetail) *RunView {
	return render(d.Run, d.Steps)
}

// render is the one rendering of a run from its rows.
func render(r readmodel.RunRow, rows []readmodel.StepRow) *RunView {
	v := &RunView{RunID: r.RunID, Status: r.Status, Workflow: r.WorkflowName, Input: canonical(r.Input),
		Output: canonical(r.Output), Error: r.Error, ErrorCode: r.ErrorCode, FailedStep: r.FailedStep,
		ParentRunID: r.ParentRunID, ParentStepID: r.ParentStepID, Depth: r.Depth, Resumes: r.Resumes,
		LastWorker: r.LastWorker, LastSeq: r.LastSeq,
		Usage: event.Usage{InputTokens: r.InputTokens, OutputTokens: r.OutputTokens, TotalTokens: r.TotalTokens, CostUSD: r.CostUSD,
			CostUnknown: r.CostUnknown, CacheReadTokens: r.CacheReadTokens, CacheWriteTokens: r.CacheWriteTokens,
			ReasoningTokens: r.ReasoningTokens},
		CreatedAt: FormatTime(r.CreatedAt), UpdatedAt: FormatTime(r.UpdatedAt), EndedAt: FormatTime(r.EndedAt),
		Spent:    engine.Spend{CostUSD: r.CostUSD, Tokens: r.TotalTokens, Steps: r.StepsSpent},
		PausedOn: r.PausedOn, JournalRemovedAt: FormatTime(r.JournalRemovedAt), Queue: event.QueueOr(r.Queue), Steps: []StepView{},
		Schedule: r.Schedule, Tick: FormatTime(r.Tick), Thread: r.Thread}
	if len(r.Labels) > 0 {
		v.Labels = r.Labels
	}
	v.Budget = optional[event.Budget](r.Budget)
	v.ForkedFrom = optional[ForkPoint](r.ForkedFrom)
	// Attempts grouped by step, steps in journal order (the first seq of
	// their first attempt), attempts by number.
	rows = slices.Clone(rows)
	first := map[string]uint64{}
	for _, s := range rows {
		if f, ok := first[s.StepID]; !ok || s.FirstSeq < f {
			first[s.StepID] = s.FirstSeq
		}
	}
	slices.SortStableFunc(rows, func(a, b readmodel.StepRow) int {
		fa, fb := first[a.StepID], first[b.StepID]
		switch {
		case fa != fb:
			return cmpUint(fa, fb)
		case a.StepID != b.StepID:
			if a.StepID < b.StepID {
				return -1
			}
			return 1
		default:
			return a.Attempt - b.Attempt
		}
	})
	for i := 0; i < len(rows); {
		j := i
		for j < len(rows) && rows[j].StepID == rows[i].StepID {
			j++
		}
		v.Steps = append(v.Steps, stepView(rows[i:j]))
		i = j
	}
	if v.Status.Terminal() {
		// A step still running, waiting or in backoff when its run ended
		// never will end: say so, as the waterfall does.
		for i, s := range v.Steps {
			if !ended(s.Status) {
				v.Steps[i].Status = StepInterrupted
			}
		}
	}
	return v
}

// stepView renders one step from its attempts (in attempt order).
func stepView(attempts []readmodel.StepRow) StepView {
	last := attempts[len(attempts)-1]
	sv := StepView{StepID: last.StepID, NodeType: last.NodeType, Status: stepStatus(last.Status),
		Attempt: last.Attempt, Attempts: len(attempts), Key: last.IdempotencyKey, Input: canonical(last.Input), Output: canonical(last.Output),
		Error: last.Error, Delivery: last.Delivery, Model: last.Model}
	var started time.Time
	var usage event.Usage
	for _, a := range attempts {
		if started.IsZero() || (!a.StartedAt.IsZero() && a.StartedAt.Before(started)) {
			started = a.StartedAt
		}
		usage.Add(attemptUsage(a))
	}
	if usage != (event.Usage{}) {
		sv.Usage = &usage
	}
	sv.Models = modelUsages(attempts)
	sv.StartedAt = FormatTime(started)
	if ended(last.Status) && !last.EndedAt.IsZero() {
		sv.EndedAt = FormatTime(last.EndedAt)
		if !started.IsZero() {
			sv.DurationMs = micro(last.EndedAt).Sub(micro(started)).Milliseconds()
		}
		if !last.WaitingAt.IsZero() {
			sv.WaitMs = micro(last.EndedAt).Sub(micro(last.WaitingAt)).Milliseconds()
		}
	}
	sv.WaitingSince = FormatTime(last.WaitingAt)
	sv.Substeps = substepViews(last.Substeps)
	sv.CopiedFrom = optional[event.CopiedFrom](last.CopiedFrom)
	return sv
}

// attemptUsage is the usage of one attempt's row.
func attemptUsage(a readmodel.StepRow) event.Usage {
	return event.Usage{InputTokens: a.InputTokens, OutputTokens: a.OutputTokens, TotalTokens: a.InputTokens + a.OutputTokens,
		CacheReadTokens: a.CacheReadTokens, CacheWriteTokens: a.CacheWriteTokens, ReasoningTokens: a.ReasoningTokens,
		CostUSD: a.CostUSD, CostUnknown: a.CostUnknown}
}

// modelUsages is what a step's attempts spent on each model they called,
// when they called more than one; nil otherwise.
func modelUsages(attempts []readmodel.StepRow) []ModelUsage {
	var out []ModelUsage
	for _, a := range attempts {
		if a.Model == "" {
			continue
		}
		i := slices.IndexFunc(out, func(m ModelUsage) bool { return m.Model == a.Model })
		if i < 0 {
			out = append(out, ModelUsage{Model: a.Model})
			i = len(out) - 1
		}
		out[i].Attempts++
		out[i].Usage.Add(attemptUsage(a))
	}
	if len(out) < 2 {
		return nil
	}
	return out
}

// optional decodes a nullable JSON column: nil when it is empty, null or
// not a T.
func optional[T any](raw json.RawMessage) *T {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var v T
	if json.Unmarshal(raw, &v) != nil {
		return nil
	}
	return &v
}

// substepViews decodes a steps row's sub-steps, outputs canonical as
// both sources agree on them.
func substepViews(raw json.RawMessage) []SubstepView {
	var subs []engine.Substep
	if len(raw) == 0 || json.Unmarshal(raw, &subs) != nil || len(subs) == 0 {
		return nil
	}
	out := make([]SubstepView, len(subs))
	for i, s := range subs {
		out[i] = SubstepView{Name: s.Name, Status: s.Status, Output: canonical(s.Output)}
	}
	return out
}

// stepStatus is the latest-attempt rule: a step is what its latest
// attempt is, except that an attempt that failed and was followed by a
// journaled retry means the step is retrying (in backoff, the next
// attempt not started yet).
func stepStatus(s engine.StepStatus) engine.StepStatus {
	if s == engine.StepRetried {
		return engine.StepRetrying
	}
	return s
}

func ended(s engine.StepStatus) bool {
	return s == engine.StepCompleted || s == engine.StepFailed
}

// micro truncates t to the precision both sources keep.
func micro(t time.Time) time.Time { return t.Truncate(time.Microsecond) }

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// canonical re-encodes a JSON value with sorted keys and no spaces, as
// both sources then agree on it (Postgres jsonb reorders keys).
func canonical(raw json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}
