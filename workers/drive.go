package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/telemetry"
)

// errRunEnded: another writer ended the run (run_cancelled) while we drove it.
var errRunEnded = errors.New("run ended by another writer")

// errParked: the run waits for an outside input (an approval, a child run);
// the drive ends and the work is acked.
var errParked = errors.New("run parked")

// errJournal: the run's journal does not fold. Nothing more can be done
// with the run; driving it again would not help.
var errJournal = errors.New("journal does not fold")

// drive is one worker's turn at driving one run.
type drive struct {
	w       *Worker
	runID   string
	ctx     context.Context
	cancel  context.CancelCauseFunc
	keeper  *keeper
	head    eventstore.Head
	st      *engine.RunState
	pending []event.Event
	log     *slog.Logger
	bug     error
	// inline is set when a parent run drives this (child) run in its own
	// drive; the parent, not the work queue, learns how it ended.
	inline bool
	// conflicts counts journal conflicts resolved by folding inputs.
	conflicts int
	// resumed: this drive's run_resumed is in the journal, so the next
	// drive counts a crash of this one toward crash_loop.
	resumed bool
	// landed is called once this drive's run_resumed is in the journal
	// (resume, resumePending).
	landed func()
	// resumeTries counts resumes after a stale writer's append beat
	// run_resumed.
	resumeTries int
	// reportErr is set when a process step's sub-step report could not
	// be journaled: the process is stopped and the drive ends.
	reportErr error
	// trace is the drive's trace, opened by resume; nil until then (and
	// a no-op with tracing off). earlier holds the trace ids the run's
	// earlier drives journaled on their run_resumed, oldest first.
	trace   *telemetry.Drive
	earlier []string
	// read is the journal read withLease starts while it takes the lease;
	// the first load uses it, when the lease came at once.
	read <-chan journalRead
	// cached is the run's state as this worker last parked it, if it
	// kept it: the first load reads only what came after.
	cached *folded
	// lease is the lease being taken while a fresh run's first drive
	// reads, folds and flushes its run_resumed (withLease); nil once
	// awaitLease has its answer, and for every other drive, which holds
	// the lease before it starts.
	lease *pendingLease
	msg   jetstream.Msg
}

// handle drives the run named by a work message and settles the message.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	runID, ok := eventstore.RunIDFromWork(msg.Subject())
	if !ok || event.ValidateRunID(runID) != nil {
		w.log.Error("dropping work message with a malformed subject", "subject", msg.Subject())
		w.settle(ctx, w.log, msg, deadMsg, errors.New("the subject names no valid run id"))
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

func (w *Worker) driveRun(ctx context.Context, runID string, msg jetstream.Msg) error {
	d := &drive{w: w, runID: runID, log: w.log.With("run_id", runID)}
	end := w.withLease(ctx, d, msg)
	if end.outcome.over() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		w.signReceipt(actx, d)
		parked := end.outcome == driveParked
		if parked && d.st != nil && d.bug == nil && len(d.pending) == 0 && d.st.LastSeq == d.head.Seq {
			// The next drive takes the state whole: afterDrive no longer
			// reads it.
			// The kept head names its driver, so the next drive's read of
			// what came after it applies the writer rule from the first
			// message on: a forged step event before the next run_resumed
			// is caught as it is on a read from the start.
			head := d.head
			head.Driver = d.st.LastWorker
			w.keepSnapshot(d)
			w.folded.put(runID, &folded{st: d.st, head: head, earlier: d.earlier, at: time.Now()})
		} else if d.st != nil && d.st.Status.Terminal() && !d.inline {
			w.dropSnapshot(d)
		}
		w.afterDrive(actx, d, parked)
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
	if d.lease != nil && !resuming {
		if err := d.awaitLease(); err != nil {
			return err
		}
	}
	if d.keeper != nil && !d.keeper.valid() {
		d.cancel(errLeaseExpired)
		return errLeaseExpired
	}
	head, err := d.w.store.Append(d.ctx, d.runID, d.head, d.pending...)
	d.pending = d.pending[head.Seq-before.Seq:]
	d.head = head
	// The flush that carried the token went out while the lease was being
	// taken: nothing goes on, not even a conflict's reload, without it.
	if lerr := d.awaitLease(); lerr != nil {
		return lerr
	}
	if resuming && !d.resumePending() {
		d.landed()
	}
	if err == nil {
		if !d.inline && d.w.snaps.due(d.runID, head.Seq) {
			d.w.keepSnapshot(d)
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
