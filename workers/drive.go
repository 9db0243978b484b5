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
}

// handle drives the run named by a work message and settles the message.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	runID, ok := eventstore.RunIDFromWork(msg.Subject())
	if !ok || event.ValidateRunID(runID) != nil {
		w.log.Error("dropping work message with a malformed subject", "subject", msg.Subject())
		_ = msg.Term()
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
	log := w.log.With("run_id", runID)
	lease, err := w.acquire(ctx, runID, msg)
	if err != nil {
		if ctx.Err() != nil {
			if msg != nil {
				_ = msg.Nak()
			}
			return ctx.Err()
		}
		log.Info("run is leased by another worker; retrying later", "err", err)
		if msg != nil {
			_ = msg.NakWithDelay(w.leases.TTL())
		}
		return err
	}
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer w.track(runID, cancel)()
	d := &drive{w: w, runID: runID, ctx: dctx, cancel: cancel, log: log}
	d.keeper = startKeeper(dctx, w.leases, lease, msg, cancel)

	err = d.run()
	held := d.keeper.stop()
	cause := context.Cause(dctx)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	if errors.Is(cause, errRunEnded) {
		err = errRunEnded
	}
	switch {
	case err == nil || errors.Is(err, errRunEnded) || errors.Is(err, errParked) || errors.Is(err, eventstore.ErrRunNotFound):
		switch {
		case errors.Is(err, eventstore.ErrRunNotFound):
			log.Warn("work for a run with no journal; dropping it")
		case errors.Is(err, errRunEnded):
			log.Info("run ended by another writer; letting it go", "seq", d.head.Seq)
		case errors.Is(err, errParked):
			log.Info("run parked", "seq", d.head.Seq)
		}
		if msg != nil {
			if aerr := msg.DoubleAck(rctx); aerr != nil {
				log.Warn("acking work", "err", aerr)
			}
		}
		if rerr := w.leases.Release(rctx, &held); rerr != nil {
			log.Warn("releasing lease", "err", rerr)
		}
		w.afterDrive(rctx, d, errors.Is(err, errParked))
		return nil
	case errors.Is(err, errJournal):
		log.Error("cannot drive the run", "err", err)
		if msg != nil {
			_ = msg.Term()
		}
		_ = w.leases.Release(rctx, &held)
		return err
	case errors.Is(cause, errShutdown) || ctx.Err() != nil:
		// Graceful hand-off: free the lease, then put the work back so
		// another worker resumes at once.
		if rerr := w.leases.Release(rctx, &held); rerr != nil {
			log.Warn("releasing lease", "err", rerr)
		}
		if msg != nil {
			_ = msg.Nak()
		}
		log.Info("handed run back", "seq", d.head.Seq)
		return errShutdown
	case errors.Is(cause, errLeaseLost), errors.Is(cause, errLeaseExpired), errors.Is(cause, errOwnership),
		errors.Is(err, errOwnership), errors.Is(err, errLeaseExpired):
		// Lost the lease or the journal: someone else owns the run now.
		// Leave the work message alone; its owner settles it.
		if cause != nil {
			err = cause
		}
		log.Warn("drive interrupted", "err", err, "seq", d.head.Seq)
		return err
	default:
		// Anything else (NATS unavailable for longer than the retries, a
		// bug): let go of the run and have it driven again later.
		log.Warn("drive interrupted", "err", err, "seq", d.head.Seq)
		_ = w.leases.Release(rctx, &held)
		if msg != nil {
			_ = msg.NakWithDelay(w.leases.TTL())
		}
		return err
	}
}

// acquire takes the run's lease, waiting for a crashed owner's lease to
// expire (at most one TTL and a bit) while keeping the message alive.
func (w *Worker) acquire(ctx context.Context, runID string, msg jetstream.Msg) (*eventstore.Lease, error) {
	lease, err := w.leases.Acquire(ctx, runID, w.owner)
	if err == nil || !errors.Is(err, eventstore.ErrLeaseHeld) {
		return lease, err
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
		return nil, err
	}
	return w.leases.Acquire(ctx, runID, w.owner)
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
	if err := d.resume(); err != nil {
		return err
	}
	for {
		if err := d.ctx.Err(); err != nil {
			return context.Cause(d.ctx)
		}
		switch a := engine.Next(d.st.Workflow, d.st, d.w.now()).(type) {
		case engine.Done:
			return d.flush()
		case engine.Complete:
			d.emit(event.RunSucceeded, "", 0, event.RunSucceededData{Output: a.Output})
			return d.flush()
		case engine.Fail:
			d.emit(event.RunFailed, "", 0, event.RunFailedData{Error: a.Error, Code: a.Code, StepID: a.StepID})
			return d.flush()
		case engine.RunStep:
			if err := d.runStep(a.Plan); err != nil {
				return err
			}
		default:
			return fmt.Errorf("run %s: unexpected action %T", d.runID, a)
		}
	}
}

// load reads and folds the whole journal.
func (d *drive) load() error {
	evs, head, err := d.w.store.Read(d.ctx, d.runID)
	if err != nil {
		return err
	}
	st, err := engine.Fold(evs)
	if err != nil {
		return d.unfoldable(evs, head, err)
	}
	d.st, d.head, d.pending = st, head, nil
	return nil
}

// unfoldable ends a run whose journal does not fold (a bug, or a journal
// written by hand): if it has no terminal event, run_failed is appended so
// the run ends visibly instead of being driven again and again.
func (d *drive) unfoldable(evs []event.Event, head eventstore.Head, ferr error) error {
	for _, ev := range evs {
		if ev.Kind.Terminal() {
			return fmt.Errorf("%w: run %s: %v", errJournal, d.runID, ferr)
		}
	}
	ev := event.MustNew(event.RunFailed, "", 0, event.RunFailedData{Code: event.CodeInternal,
		Error: fmt.Sprintf("the journal does not fold: %v", ferr)})
	ev.WorkerID = d.w.cfg.ID
	if _, err := d.w.store.Append(d.ctx, d.runID, head, ev); err != nil {
		return fmt.Errorf("%w: run %s: %v (and run_failed could not be appended: %v)", errJournal, d.runID, ferr, err)
	}
	return fmt.Errorf("%w: run %s: %v (the run is failed)", errJournal, d.runID, ferr)
}

// resume appends run_resumed, the fencing token of this drive. A run
// whose drives keep crashing without progress fails instead.
func (d *drive) resume() error {
	for tries := 0; ; tries++ {
		crashed := d.st.DriveOpen
		crashes := 0
		if crashed {
			crashes = d.st.CrashesAtStep + 1
		}
		d.emit(event.RunResumed, "", 0, event.RunResumedData{
			Worker: d.w.cfg.ID, ResumeCount: d.st.Resumes + 1, Crashed: crashed, CrashesAtStep: crashes})
		if crashes >= d.w.cfg.MaxCrashes {
			step := d.currentStep()
			d.emit(event.RunFailed, "", 0, event.RunFailedData{Code: event.CodeCrashLoop, StepID: step,
				Error: fmt.Sprintf("run crashed its workers %d times in a row without completing a step (at step %q); giving up", crashes, step)})
		}
		err := d.flush()
		if err == nil {
			if crashed {
				d.log.Info("resuming run after an interrupted drive", "resume", d.st.Resumes, "seq", d.head.Seq)
			}
			return nil
		}
		if !errors.Is(err, eventstore.ErrConflict) || tries >= 2 {
			return err
		}
		// A stale writer slipped an append in before our token: reload
		// and try again; we hold the lease.
		if err := d.load(); err != nil {
			return err
		}
		if d.st.Status.Terminal() || d.st.Status == engine.StatusWaiting {
			return nil
		}
	}
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
	if !d.keeper.valid() {
		d.cancel(errLeaseExpired)
		return errLeaseExpired
	}
	before := d.head
	head, err := d.w.store.Append(d.ctx, d.runID, d.head, d.pending...)
	d.pending = d.pending[head.Seq-before.Seq:]
	d.head = head
	if err == nil {
		return nil
	}
	if errors.Is(err, eventstore.ErrConflict) {
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

// wakeable reports whether a waiting run has something to do now: a
// decision arrived, its wait timed out (Next decides that, at the
// worker's clock), or the child it waits for can go on or has ended.
func (d *drive) wakeable() bool {
	rs, ok := engine.Next(d.st.Workflow, d.st, d.w.now()).(engine.RunStep)
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
func (w *Worker) afterDrive(ctx context.Context, d *drive, parked bool) {
	if d.st == nil || d.inline {
		return
	}
	if d.st.Status.Terminal() && d.st.Created.ParentRunID != "" {
		if err := w.store.Enqueue(ctx, d.st.Created.ParentRunID, "child"); err != nil {
			d.log.Warn("waking the parent run", "parent", d.st.Created.ParentRunID, "err", err)
		}
		return
	}
	if !parked {
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
