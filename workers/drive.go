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

// pendingLease is an Acquire under way; done is closed once lease or err
// is set.
type pendingLease struct {
	done  chan struct{}
	lease *eventstore.Lease
	err   error
}

// noLeaseError: the lease a fresh run's first drive was taking went to
// another worker (or could not be taken); the drive has acted on nothing.
type noLeaseError struct{ err error }

func (e *noLeaseError) Error() string { return "taking the run's lease: " + e.err.Error() }
func (e *noLeaseError) Unwrap() error { return e.err }

// journalRead is the result of one Store.Read, or of a ReadAfter from
// from's head when the read started from the run's snapshot.
type journalRead struct {
	evs  []event.Event
	head eventstore.Head
	err  error
	from *folded
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

// signReceipt signs the receipt of a run the drive saw end. A failure is
// only logged: the recovery sweep signs runs that have none.
func (w *Worker) signReceipt(ctx context.Context, d *drive) {
	if d.st == nil || !d.st.Status.Terminal() || w.cfg.Receipts == nil || w.cfg.SigningKey == nil {
		return
	}
	r, err := w.cfg.Receipts.Ensure(ctx, w.cfg.SigningKey, d.runID)
	if err != nil {
		d.log.Warn("signing the run receipt; the recovery sweep will try again", "err", err)
		return
	}
	d.log.Debug("run receipt", "key_id", r.KeyID, "journal_digest", r.JournalDigest)
}

// withLease takes the run's lease (waiting out a crashed holder's), drives
// d under a keeper that renews the lease and keeps msg alive, with a
// context cancelled the moment the lease is lost, and then settles msg and
// the lease by the outcome's disposition. msg is nil for a drive outside
// the work queue (Drive, an inline child). Every drive, top-level or
// inline, goes through here.
func (w *Worker) withLease(ctx context.Context, d *drive, msg jetstream.Msg) driveEnd {
	start := time.Now()
	// The journal is read while the lease is taken: one round trip less
	// before the run goes on. A read that races an append is safe, as
	// every append is fenced on the head it follows; it is used only when
	// the lease came at once (a crashed holder's journal may move while
	// its lease runs out).
	rctx, stopRead := context.WithCancel(ctx)
	defer stopRead()
	read := make(chan journalRead, 1)
	d.cached = w.folded.take(d.runID, time.Now())
	go func(cached *folded) {
		var r journalRead
		if cached == nil && !firstDrive(msg) {
			// A worker that kept no state starts from the run's
			// snapshot, when it has one that holds, and the journal
			// after it.
			r = w.snapshotFolded(rctx, d.runID)
		}
		switch {
		case r.from != nil:
		case cached != nil:
			r.evs, r.head, r.err = w.store.ReadAfter(rctx, d.runID, cached.head)
		default:
			r.evs, r.head, r.err = w.store.Read(rctx, d.runID)
			// A start's work message can come before its run_created,
			// published beside it (§8): look again at once, a few
			// times, before the message waits (journalDueDelay).
			for wait := 200 * time.Microsecond; firstDrive(msg) && errors.Is(r.err, eventstore.ErrRunNotFound) &&
				wait < 2*time.Millisecond && rctx.Err() == nil; wait *= 3 {
				sleep(rctx, wait)
				r.evs, r.head, r.err = w.store.Read(rctx, d.runID)
			}
		}
		read <- r
	}(d.cached)
	var lease *eventstore.Lease
	if firstDrive(msg) {
		// A fresh run's first delivery: no drive of it can have begun,
		// so the lease is taken while the drive reads, folds and flushes
		// its run_resumed, one round trip less before the first step.
		// Nothing acts before the lease is in hand (awaitLease); a token
		// that lands without it only makes the lease's holder, which
		// has not acted either, resume again (docs/architecture.md §10.2).
		p := &pendingLease{done: make(chan struct{})}
		go func() {
			defer close(p.done)
			p.lease, p.err = w.leases.Acquire(ctx, d.runID, w.owner)
		}()
		d.lease, d.msg, d.read = p, msg, read
	} else {
		var waited bool
		var err error
		lease, waited, err = w.acquire(ctx, d.runID, msg)
		if !waited {
			d.read = read
		}
		if err != nil {
			end := driveEnd{err: err, stopped: ctx.Err()}
			end.outcome = classifyDrive(end)
			observeDrive(d, end, start)
			w.dispose(ctx, d, msg, end, nil)
			return end
		}
	}
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer w.track(d.runID, cancel)()
	d.ctx, d.cancel = dctx, cancel
	if lease != nil {
		d.keeper = startKeeper(dctx, w.leases, lease, msg, cancel)
	}
	err := d.safeRun(msg)
	if p := d.lease; p != nil {
		// The drive needed no lease (the run had ended, or waits): the
		// one taken meanwhile is given back.
		d.lease = nil
		<-p.done
		if p.err == nil {
			d.keeper = startKeeper(dctx, w.leases, p.lease, msg, cancel)
		}
	}
	end := driveEnd{acquired: true, err: err, cause: context.Cause(dctx), stopped: ctx.Err(), journalDue: startMayLag(msg)}
	var held *eventstore.Lease
	if d.keeper != nil {
		l := d.keeper.stop()
		held = &l
	}
	if nl := (*noLeaseError)(nil); errors.As(err, &nl) {
		end.acquired, end.err = false, nl.err
	}
	end.outcome = classifyDrive(end)
	observeDrive(d, end, start)
	w.dispose(ctx, d, msg, end, held)
	return end
}

// awaitLease waits for the lease a fresh run's first drive is taking and
// starts its keeper; a *noLeaseError when it went to another worker. A
// drive calls it before anything leaves the process but the first flush
// that carries run_resumed.
func (d *drive) awaitLease() error {
	p := d.lease
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
	case <-d.ctx.Done():
		return context.Cause(d.ctx)
	}
	d.lease = nil
	if p.err != nil {
		return &noLeaseError{err: p.err}
	}
	d.keeper = startKeeper(d.ctx, d.w.leases, p.lease, d.msg, d.cancel)
	return nil
}

// observeDrive is where a drive's end is measured: its trace ends with
// the outcome, and pal_drives_total and pal_drive_duration_seconds count
// it.
func observeDrive(d *drive, end driveEnd, start time.Time) {
	d.trace.End(end.outcome.String(), end.failure())
	telemetry.DriveEnded(end.outcome.String(), time.Since(start))
}

// driveOutcome is how a drive ended. classifyDrive decides it once; the
// dispositions table says what each one does with the work message and
// the lease.
type driveOutcome int

const (
	// driveDone: the run is terminal, or became so in this drive (a crash
	// loop fails it when resumed).
	driveDone driveOutcome = iota
	// driveParked: the run waits for an outside input (an approval, a child).
	driveParked
	// driveEnded: another writer ended the run (run_cancelled) meanwhile.
	driveEnded
	// driveNoJournal: work for a run that has no journal.
	driveNoJournal
	// driveJournalDue: a start's work message that came before its
	// run_created, which the start publishes beside it (§8): look again
	// shortly.
	driveJournalDue
	// driveBroken: the journal does not fold (the run is failed with code
	// internal if it can be); driving it again would not help.
	driveBroken
	// driveStopping: the worker stops, or the caller's context ended:
	// hand the run to another worker at once.
	driveStopping
	// driveLeaseLost: the lease was lost or expired before it was renewed.
	driveLeaseLost
	// driveFenced: another worker resumed the run (a journal conflict).
	driveFenced
	// driveBusy: the lease could not be taken; another worker drives the run.
	driveBusy
	// driveCrashed: the drive panicked after its run_resumed was
	// journaled: the next drive counts it toward crash_loop.
	driveCrashed
	// drivePanicked: the drive panicked before that, where the journal
	// cannot count it: the work message counts its deliveries instead.
	drivePanicked
	// driveRetryLater: anything else (NATS unavailable for longer than the
	// retries, a bug): let go and have the run driven again after a TTL.
	driveRetryLater
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"done", "parked", "ended", "no_journal", "journal_due", "broken",
	"stopping", "lease_lost", "fenced", "busy", "crashed", "panicked", "retry_later"}

func (o driveOutcome) String() string {
	if o < 0 || o >= numOutcomes {
		return fmt.Sprintf("driveOutcome(%d)", int(o))
	}
	return outcomeNames[o]
}

// over reports whether the drive is done with the run's work: nothing
// to retry, the caller may look at the run.
func (o driveOutcome) over() bool {
	return dispositions[o].msg == ackMsg
}

// driveEnd is what is known when a drive ends.
type driveEnd struct {
	acquired bool  // the lease was taken and the run driven
	err      error // from acquire, or returned by the drive
	cause    error // why the drive's context was cancelled, if it was
	stopped  error // the caller's context's error, if it ended
	// journalDue: the work message is a start's, young enough that its
	// run_created may still be on the way (startMayLag).
	journalDue bool
	outcome    driveOutcome
}

// classifyDrive is the one place a drive's end becomes an outcome. The order
// matters: a drive that finished its work counts as finished even if a
// stop came just after.
func classifyDrive(e driveEnd) driveOutcome {
	if !e.acquired {
		if e.stopped != nil {
			return driveStopping
		}
		return driveBusy
	}
	err := e.err
	var pe *panicError
	switch {
	case errors.Is(e.cause, errRunEnded), errors.Is(err, errRunEnded):
		return driveEnded
	case errors.Is(err, eventstore.ErrRunNotFound):
		if e.journalDue {
			return driveJournalDue
		}
		return driveNoJournal
	case errors.Is(err, errParked):
		return driveParked
	case err == nil:
		return driveDone
	case errors.Is(err, errJournal):
		return driveBroken
	case errors.As(err, &pe):
		if pe.counted {
			return driveCrashed
		}
		return drivePanicked
	case errors.Is(e.cause, errShutdown), e.stopped != nil:
		return driveStopping
	case errors.Is(e.cause, errLeaseLost), errors.Is(e.cause, errLeaseExpired):
		return driveLeaseLost
	case errors.Is(e.cause, errOwnership), errors.Is(err, errOwnership):
		return driveFenced
	case errors.Is(err, errLeaseExpired):
		return driveLeaseLost
	default:
		return driveRetryLater
	}
}

// failure is the error the drive reports: nil when its work is over.
func (e driveEnd) failure() error {
	if e.outcome.over() {
		return nil
	}
	switch e.outcome {
	case driveStopping:
		if !e.acquired {
			return e.stopped
		}
		return errShutdown
	case driveLeaseLost, driveFenced:
		if e.cause != nil {
			return e.cause
		}
	}
	return e.err
}

// fate is what becomes of a drive's work message.
type fate int

const (
	// leaveMsg: leave it alone; the run's new owner settles it.
	leaveMsg fate = iota
	ackMsg
	// nakMsg: redeliver at once.
	nakMsg
	// nakLaterMsg: redeliver after one lease TTL.
	nakLaterMsg
	// nakSoonMsg: redeliver after journalDueDelay (20 ms, doubling).
	nakSoonMsg
	// termMsg: never redeliver.
	termMsg
	// deadMsg: copy to PAL_DEAD with the reason, then term.
	deadMsg
	// poisonMsg: nakLaterMsg until the message's eventstore.MaxDeliveries-th
	// delivery, then deadMsg.
	poisonMsg
)

var fateNames = [...]string{"leave", "ack", "nak", "nak_later", "nak_soon", "term", "dead", "poison"}

func (f fate) String() string { return fateNames[f] }

// disposition is what a drive's outcome does with its work message and
// the run's lease, and how it is logged.
type disposition struct {
	msg     fate
	release bool // give the lease up (a lease lost or never taken is not ours)
	level   slog.Level
	note    string // log message; none when empty
}

var dispositions = map[driveOutcome]disposition{
	driveDone:       {msg: ackMsg, release: true},
	driveParked:     {msg: ackMsg, release: true, level: slog.LevelInfo, note: "run parked"},
	driveEnded:      {msg: ackMsg, release: true, level: slog.LevelInfo, note: "run ended by another writer; letting it go"},
	driveNoJournal:  {msg: ackMsg, release: true, level: slog.LevelWarn, note: "work for a run with no journal; dropping it"},
	driveJournalDue: {msg: nakSoonMsg, release: true, level: slog.LevelDebug, note: "start's work came before its run_created; looking again"},
	driveBroken:     {msg: deadMsg, release: true, level: slog.LevelError, note: "cannot drive the run"},
	driveStopping:   {msg: nakMsg, release: true, level: slog.LevelInfo, note: "handed run back"},
	driveLeaseLost:  {msg: leaveMsg, level: slog.LevelWarn, note: "drive interrupted"},
	driveFenced:     {msg: leaveMsg, level: slog.LevelWarn, note: "drive interrupted"},
	driveBusy:       {msg: nakLaterMsg, level: slog.LevelInfo, note: "run is leased by another worker; retrying later"},
	driveCrashed:    {msg: nakLaterMsg, release: true, level: slog.LevelWarn, note: "drive crashed; the next counts it toward crash_loop"},
	drivePanicked:   {msg: poisonMsg, release: true, level: slog.LevelWarn, note: "drive failed before resuming the run"},
	driveRetryLater: {msg: nakLaterMsg, release: true, level: slog.LevelWarn, note: "drive interrupted"},
}

// dispose settles the work message and the lease (held, nil if none was
// taken) as the outcome's disposition says. A nak frees the lease first,
// so the worker the work goes to finds it free; an ack or a term settles
// the message first.
func (w *Worker) dispose(ctx context.Context, d *drive, msg jetstream.Msg, end driveEnd, held *eventstore.Lease) {
	disp := dispositions[end.outcome]
	if disp.note != "" {
		args := []any{"outcome", end.outcome, "seq", d.head.Seq}
		if err := end.failure(); err != nil {
			args = append(args, "err", err)
		}
		d.log.Log(ctx, disp.level, disp.note, args...)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	release := func() {
		if held == nil || !disp.release {
			return
		}
		if err := w.leases.Release(rctx, held); err != nil {
			d.log.Warn("releasing lease", "err", err)
		}
	}
	if disp.msg == nakMsg || disp.msg == nakLaterMsg || disp.msg == nakSoonMsg || disp.msg == poisonMsg {
		release()
		w.settle(rctx, d.log, msg, disp.msg, end.failure())
		return
	}
	w.settle(rctx, d.log, msg, disp.msg, end.failure())
	release()
}

// settle gives the work message its fate; a nil message (a drive outside
// the work queue) has none.
func (w *Worker) settle(ctx context.Context, log *slog.Logger, msg jetstream.Msg, f fate, reason error) {
	if msg == nil {
		return
	}
	var err error
	switch f {
	case ackMsg:
		err = msg.DoubleAck(ctx)
	case nakMsg:
		err = msg.Nak()
	case nakLaterMsg:
		err = msg.NakWithDelay(w.leases.TTL())
	case nakSoonMsg:
		err = msg.NakWithDelay(journalDueDelay(msg))
	case termMsg:
		err = msg.Term()
	case deadMsg, poisonMsg:
		err = w.deadLetter(ctx, log, msg, f, reason)
	}
	if err != nil {
		log.Warn("settling work", "fate", f, "err", err)
	}
}

// acquire takes the run's lease, waiting for a crashed owner's lease to
// expire (at most one TTL and a bit) while keeping the message alive;
// waited says it had to.
func (w *Worker) acquire(ctx context.Context, runID string, msg jetstream.Msg) (_ *eventstore.Lease, waited bool, _ error) {
	lease, err := w.leases.Acquire(ctx, runID, w.owner)
	if err == nil || !errors.Is(err, eventstore.ErrLeaseHeld) {
		return lease, false, err
	}
	ttl := w.leases.TTL()
	wctx, cancel := context.WithTimeout(ctx, ttl+2*time.Second)
	defer cancel()
	if msg != nil {
		_ = msg.InProgress()
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			t := time.NewTicker(ttl / 3)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					_ = msg.InProgress()
				}
			}
		}()
	}
	if werr := w.leases.WaitFree(wctx, runID); werr != nil {
		return nil, true, err
	}
	lease, err = w.leases.Acquire(ctx, runID, w.owner)
	return lease, true, err
}

// run folds the journal, appends the fencing token and drives the run
// until it ends or parks.
func (d *drive) run() error {
	if err := d.load(); err != nil {
		return err
	}
	if d.st.Status.Terminal() {
		d.log.Debug("nothing to do", "status", d.st.Status)
		return nil
	}
	if d.st.Status == engine.StatusWaiting && !d.wakeable() {
		d.log.Debug("still waiting")
		return errParked
	}
	if d.st.DriveOpen {
		// A drive began after all: its worker may be acting, so this one
		// writes no token before it holds the lease.
		if err := d.awaitLease(); err != nil {
			return err
		}
	}
	d.resume()
	for {
		if err := d.ctx.Err(); err != nil {
			return context.Cause(d.ctx)
		}
		a := engine.NextContext(d.ctx, d.st.Workflow, d.st, d.w.now())
		if err := d.ctx.Err(); err != nil {
			// An evaluation cut short is no decision: act on none.
			return context.Cause(d.ctx)
		}
		if d.resumePending() && !carriesResumed(a) {
			if err := d.flush(); err != nil {
				if err := d.resumeAgain(err); err != nil {
					return err
				}
				continue
			}
		}
		switch a := a.(type) {
		case engine.Done:
			return d.flush()
		case engine.Complete:
			d.emit(event.RunSucceeded, "", 0, event.RunSucceededData{Output: a.Output})
			return d.flush()
		case engine.Fail:
			d.emit(event.RunFailed, "", 0, event.RunFailedData{Error: a.Error, Code: a.Code, StepID: a.StepID, Attempts: a.Attempts})
			return d.flush()
		case engine.RunStep:
			if err := d.runStep(a.Plan); err != nil {
				if err := d.resumeAgain(err); err != nil {
					return err
				}
			}
		case engine.Note:
			// A brake's record (budget_warning, budget_exceeded,
			// anomaly_detected): journaled with what comes next, and Next
			// asked again, which now sees it.
			d.emit(a.Kind, a.StepID, 0, a.Data)
		case engine.Park:
			if err := d.park(a); err != nil {
				return err
			}
		default:
			return fmt.Errorf("run %s: unexpected action %T", d.runID, a)
		}
	}
}

// load reads and folds the whole journal. A journal that does not verify
// (event.Chain) is sealed when this drive holds the lease: the run fails
// with code journal_corrupt, once, and there is nothing left to drive.
func (d *drive) load() error {
	c, snap := d.cached, false
	d.cached = nil
	if c == nil {
		c, snap = d.fromSnapshot(), true
	}
	if c != nil {
		if d.loadFolded(c) {
			if snap {
				d.w.snaps.hits.Add(1)
				d.log.Debug("resumed from the run's snapshot", "snapshot_seq", c.head.Seq, "seq", d.head.Seq)
			} else {
				d.w.folded.hit()
			}
			return nil
		}
		if snap {
			d.log.Warn("the run's snapshot does not go on to its journal; folding the journal")
		}
	}
	for tries := 0; ; tries++ {
		evs, head, err := d.readJournal()
		var cerr *event.CorruptError
		if errors.As(err, &cerr) {
			err = d.corrupt(evs, head, cerr)
			if errors.Is(err, eventstore.ErrConflict) && tries < 2 {
				continue // the subject moved on under the seal: look again
			}
			return err
		}
		if errors.Is(err, event.ErrBlob) {
			// A value the journal names is not what its hash says (or
			// not there): the run cannot be driven.
			return d.unfoldable(evs, head, err)
		}
		if err != nil {
			return err
		}
		st, err := engine.Fold(evs)
		if err != nil {
			return d.unfoldable(evs, head, err)
		}
		d.st, d.head, d.pending = st, head, nil
		d.earlier = d.earlier[:0]
		for _, ev := range evs {
			if ev.Kind == event.RunResumed && ev.TraceID != "" {
				d.earlier = append(d.earlier, ev.TraceID)
			}
		}
		return nil
	}
}

// loadFolded brings the state this worker kept when it last parked the
// run up to date: it reads and folds what came after its head. Any
// trouble (a read error, a corrupt message, an event that does not fold)
// says false, and load reads the whole journal as if nothing were kept.
func (d *drive) loadFolded(c *folded) bool {
	var r journalRead
	if ch := d.read; ch != nil {
		d.read = nil
		select {
		case r = <-ch:
		case <-d.ctx.Done():
			return false
		}
	} else {
		r.evs, r.head, r.err = d.w.store.ReadAfter(d.ctx, d.runID, c.head)
	}
	if r.err != nil || c.foldOn(r.evs) != nil {
		return false
	}
	d.st, d.head, d.pending, d.earlier = c.st, r.head, nil, c.earlier
	return true
}

// fromSnapshot returns the state of the run's snapshot, or nil, and
// leaves the journal read after it (or the whole journal's) in d.read for
// loadFolded or readJournal. The read withLease started did the
// snapshot's part, if the lease came at once.
func (d *drive) fromSnapshot() *folded {
	var r journalRead
	if ch := d.read; ch != nil {
		select {
		case r = <-ch:
		case <-d.ctx.Done():
			return nil
		}
	} else if r = d.w.snapshotFolded(d.ctx, d.runID); r.from == nil {
		return nil
	}
	back := make(chan journalRead, 1)
	back <- r
	d.read = back
	return r.from
}

// readJournal reads the whole journal: the first time, by the read
// withLease started (read again if that failed, so errors are this
// drive's own).
func (d *drive) readJournal() ([]event.Event, eventstore.Head, error) {
	if ch := d.read; ch != nil {
		d.read = nil
		select {
		case r := <-ch:
			if r.err == nil && r.from == nil {
				return r.evs, r.head, nil
			}
		case <-d.ctx.Done():
			return nil, eventstore.Head{}, context.Cause(d.ctx)
		}
	}
	return d.w.store.Read(d.ctx, d.runID)
}

// corrupt takes a journal that does not verify: evs are its sound events,
// head is where the seal goes. A run that ended before the bad message is
// left as it ended; a drive without a lease (afterDrive's look) only
// folds what a reader would see.
func (d *drive) corrupt(evs []event.Event, head eventstore.Head, cerr *event.CorruptError) error {
	pre, err := engine.Fold(evs)
	if err != nil {
		return d.unfoldable(evs, head, err)
	}
	if !pre.Status.Terminal() {
		if err := d.awaitLease(); err != nil {
			return err
		}
	}
	if pre.Status.Terminal() || d.keeper == nil {
		st, err := engine.FoldCorrupt(evs, cerr)
		if err != nil {
			return fmt.Errorf("%w: %v", errJournal, err)
		}
		d.st, d.head, d.pending = st, head, nil
		return nil
	}
	if !d.keeper.valid() {
		d.cancel(errLeaseExpired)
		return errLeaseExpired
	}
	seal, h, err := d.w.store.Seal(d.ctx, d.runID, head, cerr, d.w.cfg.ID)
	if err != nil {
		return err
	}
	d.log.Error("journal corrupt; the run is failed", "seq", cerr.Seq, "reason", cerr.Reason)
	if err := pre.Apply(seal); err != nil {
		return fmt.Errorf("%w: run %s: folding the seal: %v", errJournal, d.runID, err)
	}
	d.st, d.head, d.pending = pre, h, nil
	return nil
}

// unfoldable ends a run whose journal verifies but does not fold (a bug):
// if it has no terminal event, this worker opens a drive (run_resumed, so
// the writer rule holds) and appends run_failed in the same append, so the
// run ends visibly instead of being driven again and again.
func (d *drive) unfoldable(evs []event.Event, head eventstore.Head, ferr error) error {
	resumes := 0
	for _, ev := range evs {
		if ev.Kind.Terminal() {
			return fmt.Errorf("%w: run %s: %v", errJournal, d.runID, ferr)
		}
		if ev.Kind == event.RunResumed {
			resumes++
		}
	}
	if err := d.awaitLease(); err != nil {
		return err
	}
	resumed := event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: d.w.cfg.ID, ResumeCount: resumes + 1})
	failed := event.MustNew(event.RunFailed, "", 0, event.RunFailedData{Code: event.CodeInternal,
		Error: fmt.Sprintf("the journal does not fold: %v", ferr)})
	resumed.WorkerID, failed.WorkerID = d.w.cfg.ID, d.w.cfg.ID
	if _, err := d.w.store.Append(d.ctx, d.runID, head, resumed, failed); err != nil {
		return fmt.Errorf("%w: run %s: %v (and run_failed could not be appended: %v)", errJournal, d.runID, ferr, err)
	}
	return fmt.Errorf("%w: run %s: %v (the run is failed)", errJournal, d.runID, ferr)
}

// resume queues run_resumed, the fencing token of this drive, for the
// next flush (carriesResumed says which); nothing acts outside the process
// before it is in the journal. A run whose drives keep crashing without
// progress fails instead.
func (d *drive) resume() {
	crashed := d.st.DriveOpen
	crashes := 0
	if crashed {
		crashes = d.st.CrashesAtStep + 1
	}
	info := telemetry.DriveInfo{RunID: d.runID, Worker: d.w.cfg.ID, ResumeCount: d.st.Resumes + 1,
		Crashed: crashed, Earlier: d.earlier}
	if d.trace == nil {
		// The drive's trace opens here, so its id is on run_resumed.
		d.ctx, d.trace = telemetry.StartDrive(d.ctx, info)
	}
	lastEvent := d.st.UpdatedAt
	d.emit(event.RunResumed, "", 0, event.RunResumedData{
		Worker: d.w.cfg.ID, ResumeCount: d.st.Resumes + 1, Crashed: crashed, CrashesAtStep: crashes})
	dctx := d.ctx // the resume span is the drive's, not the step's that lands it
	d.landed = func() {
		d.resumed = true
		d.trace.Resumed(dctx, info)
		if crashed {
			telemetry.Takeover(d.w.now().Sub(lastEvent))
			d.log.Info("resuming run after an interrupted drive", "resume", d.st.Resumes, "seq", d.head.Seq)
		}
	}
	if crashes >= d.w.cfg.MaxCrashes {
		step := d.currentStep()
		d.emit(event.RunFailed, "", 0, event.RunFailedData{Code: event.CodeCrashLoop, StepID: step,
			Error: fmt.Sprintf("run crashed its workers %d times in a row without completing a step (at step %q); giving up", crashes, step)})
	}
}

// resumePending reports whether this drive's run_resumed is queued and
// not yet in the journal: resume queues it first, so it leads the pending
// events until a flush lands it.
func (d *drive) resumePending() bool {
	return len(d.pending) > 0 && d.pending[0].Kind == event.RunResumed
}

// carriesResumed says whether a, the drive's first action, may take the
// pending run_resumed along in its own first flush: a plain step flushes
// its step_started before it acts (or fails, or completes a pure step,
// without acting), so run_resumed and step_started go as one message (one
// fsync in strict mode) and nothing outside the process has seen the
// drive before its token is in the journal. Any other action flushes
// run_resumed first.
func carriesResumed(a engine.Action) bool {
	rs, ok := a.(engine.RunStep)
	return ok && rs.Plan.Wait == nil && rs.Plan.Gate == nil && rs.Plan.Exec != engine.ExecSubagent
}

// errResumeConflict: a flush that carried this drive's run_resumed found
// the journal moved: a stale writer's append came before the token.
var errResumeConflict = errors.New("an append beat run_resumed")

// resumeAgain takes err from a flush: when it is errResumeConflict, the
// drive still holds the lease, so it reloads the journal and resumes
// again (twice at most), and the caller decides afresh. Any other error is
// returned as it is.
func (d *drive) resumeAgain(err error) error {
	if !errors.Is(err, errResumeConflict) {
		return err
	}
	if d.resumeTries >= 2 {
		return err
	}
	d.resumeTries++
	if err := d.load(); err != nil { // which drops what is pending
		return err
	}
	if d.st.Status.Terminal() || d.st.Status == engine.StatusWaiting {
		return nil
	}
	d.resume()
	return nil
}

func (d *drive) currentStep() string {
	for i := len(d.st.Order) - 1; i >= 0; i-- {
		if s := d.st.Steps[d.st.Order[i]]; s.Status != engine.StepCompleted {
			return s.ID
		}
	}
	return ""
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

// park parks the run on a brake: step_waiting with the brake's reason,
// once; flushing may fold in the input that releases it (a budget_raised,
// an approval) that came meanwhile, so Next decides again before the
// drive ends.
func (d *drive) park(p engine.Park) error {
	if !p.Waiting {
		d.log.Info("run paused by its brakes", "reason", p.Reason, "step_id", p.StepID)
		d.emit(event.StepWaiting, p.StepID, 0, event.StepWaitingData{Reason: p.Reason})
		return d.flush()
	}
	if err := d.flush(); err != nil {
		return err
	}
	return errParked
}

// wakeable reports whether a waiting run has something to do now: a
// decision arrived, its wait timed out (Next decides that, at the
// worker's clock), or the child it waits for can go on or has ended.
func (d *drive) wakeable() bool {
	a := engine.NextContext(d.ctx, d.st.Workflow, d.st, d.w.now())
	if p, ok := a.(engine.Park); ok {
		return !p.Waiting
	}
	rs, ok := a.(engine.RunStep)
	if !ok {
		return true
	}
	p := rs.Plan
	switch {
	case p.Wait != nil && p.Wait.Waiting:
		return false
	case p.Exec == engine.ExecSubagent:
		if s := d.st.Steps[p.StepID]; s != nil && s.Status == engine.StepWaiting {
			return d.w.childMayProceed(d.ctx, p.ChildRunID)
		}
	}
	return true
}

// afterDrive wakes whoever must look again once a drive has let go of a
// run: a parent whose child ended, or the run itself when it parked just as
// its wake-up came (an approval that found the work message still taken).
//
// A parked drive's state may already be another drive's (folded.go), so
// for a parked run afterDrive reads only the journal: nothing after the
// head it parked at, and nothing woke it.
func (w *Worker) afterDrive(ctx context.Context, d *drive, parked bool) {
	if d.st == nil || d.inline {
		return
	}
	if !parked {
		if d.st.Status.Terminal() && d.st.Created.ParentRunID != "" {
			if err := w.store.Enqueue(ctx, d.st.Created.ParentRunID, "child"); err != nil {
				d.log.Warn("waking the parent run", "parent", d.st.Created.ParentRunID, "err", err)
			}
		}
		return
	}
	if evs, _, err := w.store.ReadAfter(ctx, d.runID, d.head); err == nil && len(evs) == 0 {
		return
	}
	fresh := &drive{w: w, runID: d.runID, ctx: ctx, log: d.log}
	if err := fresh.load(); err != nil {
		return
	}
	if !fresh.st.Status.Terminal() && fresh.wakeable() {
		d.log.Info("woken while parking; queueing the run again")
		_ = w.store.Enqueue(ctx, d.runID, "wake")
	}
}
