package workers

import (
	"context"
)

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
