package workers

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
)

// panicError is a drive that panicked, recovered so that the worker goes
// on with its other runs.
type panicError struct {
	value any
	// counted: the drive's run_resumed was journaled, so the next drive
	// counts this one as a crash (crash_loop after Config.MaxCrashes).
	counted bool
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }

// safeRun is run with a panic recovered into a *panicError, logged with
// the work message's stream sequence and the stack. A tool registered by
// the embedding program, or a bug in PAL, takes down one drive, not the
// worker.
func (d *drive) safeRun(msg jetstream.Msg) (err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		seq, n := msgIDs(msg)
		d.log.Error("drive panicked", "work_seq", seq, "delivery", n, "resumed", d.token.resumed,
			"panic", r, "stack", string(debug.Stack()))
		err = &panicError{value: r, counted: d.token.resumed}
	}()
	if h := d.w.beforeDrive.Load(); h != nil {
		(*h)(d.runID)
	}
	return d.run()
}

// deadLetter gives msg the fate deadMsg or poisonMsg: a message that may
// not be redelivered any more is copied to PAL_DEAD (pal.dead.work) with
// reason, then terminated. If the copy fails (NATS unavailable) the
// message is handed back instead, so that no work is lost.
func (w *Worker) deadLetter(ctx context.Context, log *slog.Logger, msg jetstream.Msg, f fate, reason error) error {
	why := "unknown"
	if reason != nil {
		why = reason.Error()
	}
	var dead bool
	var err error
	if f == deadMsg {
		err = w.store.Dead(ctx, eventstore.DeadWork, msg, why)
		dead = err == nil
	} else {
		dead, err = w.store.Retry(ctx, eventstore.DeadWork, msg, why, w.leases.TTL())
	}
	if dead {
		seq, n := msgIDs(msg)
		log.Warn("work dead-lettered to "+eventstore.DeadStream, "work_seq", seq, "deliveries", n,
			"reason", eventstore.DeadReason(why))
	}
	return err
}

// handleTimer wakes the run whose timer fired. A fired timer whose
// subject names no run goes to PAL_DEAD at once; one whose handling
// panics goes there on its eventstore.MaxDeliveries-th delivery. One that
// cannot be turned into work (NATS unavailable) is retried.
func (w *Worker) handleTimer(m jetstream.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			seq, n := msgIDs(m)
			w.log.Error("timer handler panicked", "subject", m.Subject(), "timer_seq", seq, "delivery", n,
				"panic", r, "stack", string(debug.Stack()))
			w.timerFailed(ctx, m, fmt.Sprintf("panic: %v", r), false)
		}
	}()
	runID, ok := eventstore.RunIDFromTimer(m.Subject())
	if !ok {
		w.timerFailed(ctx, m, "the subject names no valid run id", true)
		return
	}
	if err := w.enqueue(ctx, runID, "timer"); err != nil {
		_ = m.NakWithDelay(time.Second)
		return
	}
	_ = m.Ack()
}

// timerFailed dead-letters a fired timer (now, or on its last delivery).
func (w *Worker) timerFailed(ctx context.Context, m jetstream.Msg, reason string, now bool) {
	var dead bool
	var err error
	if now {
		err = w.store.Dead(ctx, eventstore.DeadTimers, m, reason)
		dead = err == nil
	} else {
		dead, err = w.store.Retry(ctx, eventstore.DeadTimers, m, reason, time.Second)
	}
	seq, n := msgIDs(m)
	switch {
	case err != nil:
		w.log.Warn("settling a failed timer", "subject", m.Subject(), "timer_seq", seq, "err", err)
	case dead:
		w.log.Warn("timer dead-lettered to "+eventstore.DeadStream, "subject", m.Subject(), "timer_seq", seq,
			"deliveries", n, "reason", reason)
	}
}

// recoverWork is the last guard of a work message's goroutine: a panic
// outside the drive itself (taking or settling the lease) is logged with
// the message's stream sequence and the message handed back, and the
// worker goes on.
func (w *Worker) recoverWork(msg jetstream.Msg) {
	r := recover()
	if r == nil {
		return
	}
	seq, n := msgIDs(msg)
	w.log.Error("work handler panicked", "subject", msg.Subject(), "work_seq", seq, "delivery", n,
		"panic", r, "stack", string(debug.Stack()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := w.store.Retry(ctx, eventstore.DeadWork, msg, fmt.Sprintf("panic: %v", r), w.leases.TTL()); err != nil {
		w.log.Warn("settling work after a panic", "work_seq", seq, "err", err)
	}
}

// msgIDs are a message's stream sequence and delivery count (0 for none).
func msgIDs(msg jetstream.Msg) (seq, delivered uint64) {
	if msg == nil {
		return 0, 0
	}
	if md, err := msg.Metadata(); err == nil {
		return md.Sequence.Stream, md.NumDelivered
	}
	return 0, 0
}
