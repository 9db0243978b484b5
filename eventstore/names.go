package eventstore

import (
	"strings"

	"github.com/palrun/pal/event"
)

// Stream, bucket and consumer names (public interface,
// docs/architecture.md §5).
const (
	EventsStream   = "PAL_EVENTS"
	WorkStream     = "PAL_WORK"
	CommandsStream = "PAL_CMDS"
	LeaseBucket    = "PAL_LEASES"
	// ReceiptBucket holds signed run receipts, keyed by run id (package
	// receipt).
	ReceiptBucket = "PAL_RECEIPTS"
	WorkConsumer  = "pal-workers"
	// TimersStream holds scheduled wake-ups (approval timeouts).
	TimersStream = "PAL_TIMERS"
	// TimerConsumer is the durable consumer workers take fired timers from.
	TimerConsumer   = "pal-timers"
	timerAtPrefix   = "pal.timer.at."
	timerFirePrefix = "pal.timer.fire."
	// DeadStream keeps messages whose handling kept failing, copied
	// from their stream with the reason (dead.go).
	DeadStream = "PAL_DEAD"
	// DeadPrefix is PAL_DEAD's subject prefix: pal.dead.<source>.
	DeadPrefix = "pal.dead."
	// CommandConsumer is the durable consumer workers take commands from.
	CommandConsumer = "pal-commands"
	// RejectedSubject is the core NATS subject on which a refused command
	// is announced, with the reason.
	RejectedSubject = "pal.cmd.rejected"

	// CancelPrefix is the core NATS subject prefix on which a cancel is
	// announced (pal.ctl.cancel.<run_id>), so the worker driving the run
	// stops its in-flight call at once. The journal, not this notice, is
	// the truth: a worker that misses it finds run_cancelled on its next
	// append.
	CancelPrefix = "pal.ctl.cancel."

	EventsPrefix = "pal.events."
	WorkPrefix   = "pal.work."
	// WorkPinSubject holds PAL_WORK's pin (work.go): a message no
	// consumer takes.
	WorkPinSubject = "pal.workpin"
	CommandPrefix  = "pal.cmd.runs."
	// WorkflowDeploySubject is the NATS service's deploy endpoint: the
	// roles that may deploy (eventstore/natsauth) are the only ones that
	// may request it, so its callers get the right to deploy.
	WorkflowDeploySubject = "pal.api.workflows.deploy"

	// leaseStream is the stream behind the lease bucket.
	leaseStream  = "KV_" + LeaseBucket
	leasePrefix  = "$KV." + LeaseBucket + "."
	kindHeader   = "Pal-Kind"
	reasonHeader = "Pal-Reason"
)

// checkRunID refuses a run id that is not a single NATS subject token
// (docs/architecture.md §5.5): "*", ">" or "a.b" would make a run's subject or lease key
// match other runs' (Read, Watch and LastHead would return their events)
// or none of PAL's streams (Append would retry until its context ends).
func checkRunID(runID string) error { return event.ValidateRunID(runID) }

// EventsSubject is the journal subject of a run.
func EventsSubject(runID string) string { return EventsPrefix + runID }

// WorkSubject is the work subject of a run on queue q: pal.work.<run_id>
// on the default queue (and for q empty), pal.work.<q>.<run_id> on
// another (docs/architecture.md §5.1).
func WorkSubject(q, runID string) string {
	if q == "" || q == event.DefaultQueue {
		return WorkPrefix + runID
	}
	return WorkPrefix + q + "." + runID
}

// WorkConsumerName is the durable consumer of queue q's work:
// pal-workers for the default queue, pal-workers-<q> for another.
func WorkConsumerName(q string) string {
	if q == "" || q == event.DefaultQueue {
		return WorkConsumer
	}
	return WorkConsumer + "-" + q
}

// RunIDFromEvents extracts the run id from a journal subject.
func RunIDFromEvents(subject string) (string, bool) {
	id, ok := strings.CutPrefix(subject, EventsPrefix)
	return id, ok && event.ValidateRunID(id) == nil
}
