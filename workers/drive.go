package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/telemetry"
	"github.com/palrun/pal/receipt"
)

// errRunEnded: another writer ended the run (run_cancelled) while we drove it.
var errRunEnded = errors.New("run ended by another writer")

// errParked: the run waits for an outside input (an approval, a child run);
// the drive ends and the work is acked.
var errParked = errors.New("run parked")

// errJournal: the run's journal does not fold. Nothing more can be done
// with the run; driving it again would not help.
var errJournal = errors.New("journal does not fold")

// drive is one worker's turn at driving one run. What one job of the
// drive holds is grouped under that job's field (lease.go, load.go,
// resume.go); the rest is what every job shares: the run, its state and
// the journal's head, and how the drive writes (emit, flush).
type drive struct {
	w      *Worker
	runID  string
	ctx    context.Context
	cancel context.CancelCauseFunc
	log    *slog.Logger
	// st is the run's state: the journal folded through head, then the
	// pending events, which the next flush appends.
	st      *engine.RunState
	head    eventstore.Head
	pending []event.Event
	// bug is an event the engine produced and its own fold rejects: the
	// drive appends nothing more.
	bug error
	// conflicts counts journal conflicts resolved by folding inputs
	// (onConflict).
	conflicts int
	// inline is set when a parent run drives this (child) run in its own
	// drive; the parent, not the work queue, learns how it ended.
	inline bool
	// tally is the receipt's tally of the journal through head (end.go);
	// nil when the drive holds no whole tally (it started from a
	// snapshot, or sealed a corrupt journal).
	tally *receipt.Tally
	// reportErr is set when a process step's sub-step report could not
	// be journaled: the process is stopped and the drive ends.
	reportErr error
	// threadDone are the thread steps whose turns this drive found in
	// (or appended to) the run's thread (thread.go).
	threadDone map[string]bool

	lease driveLease
	from  driveSource
	token driveToken
	// fly is what the drive has in flight (flight.go).
	fly *flight
}

// handle drives the run named by a work message; the drive gives the
// message its fate.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	runID, _, ok := eventstore.RunIDFromWork(msg.Subject())
	if !ok || event.ValidateRunID(runID) != nil {
		w.log.Error("dropping work message with a malformed subject", "subject", msg.Subject())
		w.applyFate(ctx, w.log, msg, deadMsg, errors.New("the subject names no valid run id"))
		return
	}
	w.driveRun(ctx, runID, msg)
}

// Drive drives one run now, outside the work queue (tests, tools). It
// returns when the run ends or parks, or the drive is interrupted.
func (w *Worker) Drive(ctx context.Context, runID string) error {
	if err := event.ValidateRunID(runID); err != nil {
		return err
	}
	return w.driveRun(ctx, runID, nil)
}

// driveRun is one drive of a run outside an inline parent's: under its
// lease, and then the end of a drive (end.go) when the run's work is over.
func (w *Worker) driveRun(ctx context.Context, runID string, msg jetstream.Msg) error {
	d := &drive{w: w, runID: runID, log: w.log.With("run_id", runID)}
	end := w.withLease(ctx, d, msg)
	if end.outcome.over() {
		w.endDrive(ctx, d, end.outcome == driveParked)
	}
	return end.failure()
}

// emit stamps an event, folds it into the state and queues it for the
// next flush. The state therefore runs ahead of the journal by the pending
// events; flush makes them durable before anything depends on them
// outside this process.
func (d *drive) emit(kind event.Kind, stepID string, attempt int, payload any) {
	ev := event.MustNew(kind, stepID, attempt, payload)
	ev.RunID = d.runID
	ev.WorkerID = d.w.cfg.ID
	ev.Seq = d.st.LastSeq + 1
	ev.TS = d.w.now()
	ev.TraceID = telemetry.TraceID(d.ctx) // "" with tracing off
	if err := d.st.Apply(ev); err != nil {
		// The engine produced an event its own fold rejects: a bug. Stop
		// the drive before anything is appended.
		d.bug = fmt.Errorf("run %s: emitting %s: %w", d.runID, kind, err)
		d.cancel(d.bug)
		return
	}
	d.pending = append(d.pending, ev)
}

// flush appends the pending events, fenced on the head this drive last
// saw. It refuses to append once the lease may have expired.
func (d *drive) flush() error {
	if d.bug != nil {
		return d.bug
	}
	if len(d.pending) == 0 {
		return nil
	}
	before, resuming := d.head, d.resumePending()
	if d.lease.taking != nil && !resuming {
		if err := d.awaitLease(); err != nil {
			return err
		}
	}
	if d.lease.expired() {
		d.cancel(errLeaseExpired)
		return errLeaseExpired
	}
	settle := d.st.Created.Thread != "" && (d.threadDone == nil || completes(d.pending))
	head, err := d.w.store.Append(d.ctx, d.runID, d.head, d.pending...)
	if d.tally != nil {
		d.tally.Add(d.pending[:head.Seq-before.Seq]...) // stamped and chained by Append
	}
	d.pending = d.pending[head.Seq-before.Seq:]
	d.head = head
	// The flush that carried the token went out while the lease was being
	// taken: nothing goes on, not even a conflict's reload, without it.
	if lerr := d.awaitLease(); lerr != nil {
		return lerr
	}
	if resuming && !d.resumePending() {
		d.token.landed()
	}
	if err == nil {
		if !d.inline && d.w.snaps.due(d.runID, head.Seq) {
			d.w.keepSnapshot(d)
		}
		// A thread step's step_completed is durable: its turns go to the
		// thread (thread.go). A drive's first flush looks at every
		// completed step, later ones when they carried a completion.
		if settle {
			return d.settleThreads(false)
		}
		return nil
	}
	if errors.Is(err, eventstore.ErrConflict) {
		if d.resumePending() {
			return fmt.Errorf("%w: %w", errResumeConflict, err)
		}
		return d.onConflict(err)
	}
	if c := context.Cause(d.ctx); c != nil {
		return c
	}
	return err
}

// onConflict finds out who moved the journal: another worker's
// run_resumed means we lost the run; a terminal event (a cancel) means
// the run is over.
func (d *drive) onConflict(cerr error) error {
	evs, _, err := d.w.store.ReadAfter(d.ctx, d.runID, d.head)
	if errors.Is(err, event.ErrJournalCorrupt) {
		// Something that is not a sound event landed after our head: the
		// run cannot go on. load seals it (journal_corrupt).
		if err := d.load(); err != nil {
			return err
		}
		d.cancel(errRunEnded)
		return errRunEnded
	}
	if err != nil {
		return fmt.Errorf("%w (then reading the journal: %v)", cerr, err)
	}
	inputs := len(evs) > 0
	for _, ev := range evs {
		if ev.Kind.Terminal() {
			d.log.Debug("journal conflict: the run was ended", "kind", ev.Kind, "seq", ev.Seq)
			d.cancel(errRunEnded)
			return errRunEnded
		}
		inputs = inputs && ev.Kind.Input()
	}
	if inputs && d.conflicts < 10 {
		// Someone appended an input (a decision) while we drove: it does
		// not take the run from us. Fold it in before our pending events
		// and append them again after it.
		d.conflicts++
		pending := d.pending
		if err := d.load(); err != nil {
			return err
		}
		for _, ev := range pending {
			ev.Seq = d.st.LastSeq + 1
			if err := d.st.Apply(ev); err != nil {
				d.cancel(errOwnership)
				return fmt.Errorf("%w: refolding after an input: %v", errOwnership, err)
			}
			d.pending = append(d.pending, ev)
		}
		return d.flush()
	}
	d.cancel(errOwnership)
	return fmt.Errorf("%w: %v", errOwnership, cerr)
}
