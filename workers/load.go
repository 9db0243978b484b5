package workers

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/receipt"
)

// driveSource is where a drive's first load starts from.
type driveSource struct {
	// read is the journal read started while the lease is taken
	// (readAhead); the first load uses it, when the lease came at once.
	read <-chan journalRead
	// cached is the run's state as this worker last parked it, if it
	// kept it: the first load reads only what came after.
	cached *folded
}

// journalRead is the result of one Store.Read, or of a ReadAfter from
// from's head when the read started from the run's snapshot.
type journalRead struct {
	evs  []event.Event
	head eventstore.Head
	err  error
	from *folded
}

// readAhead starts the read of d's journal while withLease takes the
// lease: one round trip less before the run goes on. A read that races an
// append is safe, as every append is fenced on the head it follows. It
// takes the state this worker kept of the run, if any (d.from.cached),
// and reads what came after it; a worker that kept none starts from the
// run's snapshot, when it has one that holds, and the journal after it.
func (w *Worker) readAhead(ctx context.Context, d *drive, msg jetstream.Msg) <-chan journalRead {
	read := make(chan journalRead, 1)
	d.from.cached = w.folded.take(d.runID)
	go func(cached *folded) {
		var r journalRead
		switch {
		case cached != nil:
			r.evs, r.head, r.err = w.store.ReadAfter(ctx, d.runID, cached.head)
		case firstDrive(msg):
			r = w.readStart(ctx, d.runID)
		default:
			if r = w.snapshotFolded(ctx, d.runID); r.from == nil {
				r.evs, r.head, r.err = w.store.Read(ctx, d.runID)
			}
		}
		read <- r
	}(d.from.cached)
	return read
}

// load reads and folds the whole journal. A journal that does not verify
// (event.Chain) is sealed when this drive holds the lease: the run fails
// with code journal_corrupt, once, and there is nothing left to drive.
func (d *drive) load() error {
	c, snap := d.from.cached, false
	d.from.cached = nil
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
		d.tally = receipt.NewTally(d.runID)
		d.tally.Add(evs...)
		d.token.earlier = d.token.earlier[:0]
		for _, ev := range evs {
			if ev.Kind == event.RunResumed && ev.TraceID != "" {
				d.token.earlier = append(d.token.earlier, ev.TraceID)
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
	if ch := d.from.read; ch != nil {
		d.from.read = nil
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
	if c.tally != nil {
		c.tally.Add(r.evs...)
	}
	d.st, d.head, d.pending, d.token.earlier, d.tally = c.st, r.head, nil, c.earlier, c.tally
	return true
}

// fromSnapshot returns the state of the run's snapshot, or nil, and
// leaves the journal read after it (or the whole journal's) in
// d.from.read for loadFolded or readJournal. The read readAhead started
// did the snapshot's part, if the lease came at once.
func (d *drive) fromSnapshot() *folded {
	var r journalRead
	if ch := d.from.read; ch != nil {
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
	d.from.read = back
	return r.from
}

// readJournal reads the whole journal: the first time, by the read
// readAhead started (read again if that failed, so errors are this
// drive's own).
func (d *drive) readJournal() ([]event.Event, eventstore.Head, error) {
	if ch := d.from.read; ch != nil {
		d.from.read = nil
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
	if pre.Status.Terminal() || d.lease.keeper == nil {
		st, err := engine.FoldCorrupt(evs, cerr)
		if err != nil {
			return fmt.Errorf("%w: %v", errJournal, err)
		}
		d.st, d.head, d.pending, d.tally = st, head, nil, nil
		return nil
	}
	if d.lease.expired() {
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
	d.st, d.head, d.pending, d.tally = pre, h, nil, nil
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
