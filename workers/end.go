package workers

import (
	"context"
	"errors"
	"time"

	"github.com/palrun/pal/receipt"
)

// endDrive is the end of a drive whose work is over (the run ended or
// parked): the run's receipt is signed, the state of a parked run kept for
// its next drive here (folded.go) and snapshotted, an ended run's snapshot
// dropped, and whoever must look again woken (afterDrive).
func (w *Worker) endDrive(ctx context.Context, d *drive, parked bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	w.signReceipt(ctx, d)
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
		w.folded.put(d.runID, &folded{st: d.st, head: head, earlier: d.token.earlier, tally: d.tally})
	} else if d.st != nil && d.st.Status.Terminal() && !d.inline {
		w.dropSnapshot(d)
	}
	w.afterDrive(ctx, d, parked)
}

// signReceipt signs the receipt of a run the drive saw end. It is built
// from the drive's tally of the journal it read and appended, up to the
// chain head it holds: the journal is not read again. A drive that holds
// no whole tally (it started from a snapshot, or sealed a corrupt
// journal) reads the journal (Store.Ensure). A failure is only logged:
// the recovery sweep signs runs that have none.
func (w *Worker) signReceipt(ctx context.Context, d *drive) {
	if d.st == nil || !d.st.Status.Terminal() || w.cfg.Receipts == nil || w.cfg.SigningKey == nil {
		return
	}
	var r *receipt.Receipt
	var err error
	if built, berr := d.receipt(); berr == nil {
		r, err = w.cfg.Receipts.Sign(ctx, w.cfg.SigningKey, built)
	} else {
		d.log.Debug("reading the journal for the run receipt", "why", berr)
		r, err = w.cfg.Receipts.Ensure(ctx, w.cfg.SigningKey, d.runID)
	}
	if err != nil {
		d.log.Warn("signing the run receipt; the recovery sweep will try again", "err", err)
		return
	}
	d.log.Debug("run receipt", "key_id", r.KeyID, "journal_digest", r.JournalDigest)
}

// receipt is the unsigned receipt of the journal through d's head, from
// d's tally.
func (d *drive) receipt() (*receipt.Receipt, error) {
	switch {
	case d.tally == nil:
		return nil, errors.New("the drive holds no tally of the whole journal")
	case len(d.pending) > 0:
		return nil, errors.New("events are pending")
	}
	return d.tally.Receipt(d.head.Seq, d.head.Hash)
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
			if err := w.enqueue(ctx, d.st.Created.ParentRunID, "child"); err != nil {
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
		_ = w.store.Enqueue(ctx, fresh.st.Created.Queue, d.runID, "wake")
	}
}

// enqueue wakes a run the worker knows only by id (a parent whose child
// ended, a run whose timer fired) on its queue, which its run_created
// names (one Get).
func (w *Worker) enqueue(ctx context.Context, runID, reason string) error {
	q, err := w.store.QueueOf(ctx, runID)
	if err != nil {
		return err
	}
	return w.store.Enqueue(ctx, q, runID, reason)
}
