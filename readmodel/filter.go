package readmodel

import (
	"time"

	"github.com/palrun/pal/engine"
)

// DefaultListLimit and MaxListLimit bound RunFilter.Limit.
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
)

// RunFilter selects the runs of a listing (GET /v1/runs, pal run list):
// every filter set must match. A zero field keeps all.
type RunFilter struct {
	// Status keeps runs with this status.
	Status engine.Status
	// Workflow keeps runs of the workflow of this name.
	Workflow string
	// Schedule keeps runs the schedule of this name started.
	Schedule string
	// Thread keeps runs started on this thread.
	Thread string
	// Labels keeps runs that carry every one of these labels.
	Labels map[string]string
	// Queue keeps runs on this work queue.
	Queue string
	// Since keeps runs created at or after it, Until runs created before
	// it.
	Since, Until time.Time
	// ErrorCode keeps runs that ended with this error code (run_failed's
	// code: step_failed, timeout, …).
	ErrorCode string
	// Text keeps runs whose error message contains it, ignoring case.
	Text string
	// Limit caps the rows returned (DefaultListLimit; at most
	// MaxListLimit).
	Limit int
	// Before continues a listing: pass the Cursor of the last row of the
	// previous page.
	Before string
}
