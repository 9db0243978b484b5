package runs

import (
	"fmt"
	"strings"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/readmodel"
)

// RunSummary is a run in a listing (GET /v1/runs, pal run list --json):
// the RunView's run fields (labels too) without input, output, budget, spent,
// paused_on, journal_removed_at, forked_from and steps, in its formats.
type RunSummary struct {
	RunID        string        `json:"run_id"`
	Status       engine.Status `json:"status"`
	Workflow     string        `json:"workflow,omitempty"`
	ParentRunID  string        `json:"parent_run_id,omitempty"`
	ParentStepID string        `json:"parent_step_id,omitempty"`
	Depth        int           `json:"depth"`
	Usage        event.Usage   `json:"usage"`
	Error        string        `json:"error,omitempty"`
	ErrorCode    string        `json:"error_code,omitempty"`
	FailedStep   string        `json:"failed_step,omitempty"`
	Resumes      int           `json:"resumes"`
	LastWorker   string        `json:"last_worker,omitempty"`
	LastSeq      uint64        `json:"last_seq"`
	CreatedAt    string        `json:"created_at"`
	UpdatedAt    string        `json:"updated_at"`
	EndedAt      string        `json:"ended_at,omitempty"`
	// Labels are the run's labels; absent for none.
	Labels map[string]string `json:"labels,omitempty"`
	// Queue is the run's work queue.
	Queue string `json:"queue"`
	// Schedule and Tick: the run's schedule and tick; absent for none.
	Schedule string `json:"schedule,omitempty"`
	Tick     string `json:"tick,omitempty"`
	// Thread is the thread the run was started on; absent for none.
	Thread string `json:"thread,omitempty"`
}

// RunList is a page of runs. Next, when set, is the cursor of the next
// page (pass it as ?before=).
type RunList struct {
	Runs []RunSummary `json:"runs"`
	Next string       `json:"next,omitempty"`
}

// SummaryOf renders one row of the runs table.
func SummaryOf(r readmodel.RunRow) RunSummary {
	v := render(r, nil)
	return RunSummary{RunID: v.RunID, Status: v.Status, Workflow: v.Workflow, ParentRunID: v.ParentRunID,
		ParentStepID: v.ParentStepID, Depth: v.Depth, Usage: v.Usage, Error: v.Error, ErrorCode: v.ErrorCode,
		FailedStep: v.FailedStep, Resumes: v.Resumes, LastWorker: v.LastWorker, LastSeq: v.LastSeq,
		CreatedAt: v.CreatedAt, UpdatedAt: v.UpdatedAt, EndedAt: v.EndedAt, Labels: v.Labels, Queue: v.Queue,
		Schedule: v.Schedule, Tick: v.Tick, Thread: v.Thread}
}

// ListOf renders a page of projection rows; limit is the page size asked
// for (a full page gets a Next cursor).
func ListOf(rows []readmodel.RunRow, limit int) RunList {
	out := RunList{Runs: make([]RunSummary, 0, len(rows))}
	for _, r := range rows {
		out.Runs = append(out.Runs, SummaryOf(r))
	}
	if limit > 0 && len(rows) == limit {
		out.Next = rows[len(rows)-1].Cursor()
	}
	return out
}

// Statuses are the run statuses a listing can filter on.
var Statuses = []engine.Status{engine.StatusQueued, engine.StatusRunning, engine.StatusWaiting,
	engine.StatusSucceeded, engine.StatusFailed, engine.StatusCancelled}

// ParseStatus checks a status filter. Errors: *InputError.
func ParseStatus(s string) (engine.Status, error) {
	for _, st := range Statuses {
		if string(st) == s {
			return st, nil
		}
	}
	names := make([]string, len(Statuses))
	for i, st := range Statuses {
		names[i] = string(st)
	}
	return "", &InputError{Field: "status", Msg: fmt.Sprintf("%q: want one of %s", s, strings.Join(names, ", "))}
}
