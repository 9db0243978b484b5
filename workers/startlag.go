package workers

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
)

// startLooks is how many deliveries of a start's work message look for
// its run_created before the work is dropped as work for a run with no
// journal: at journalDueDelay's pace (20 ms, doubling to 1 s) about
// eventstore.StartLag, counted by deliveries rather than by the message's
// age, so that no clock's skew moves it.
const startLooks = 36

// journalDueDelay is how long a start's work message that came before
// its run_created waits before the next look: 20 ms, doubling with each
// delivery up to a second, so work whose start failed costs a few dozen
// looks before startLooks drops it.
func journalDueDelay(msg jetstream.Msg) time.Duration {
	d := 20 * time.Millisecond
	if meta, err := msg.Metadata(); err == nil {
		for n := uint64(1); n < meta.NumDelivered && d < time.Second; n++ {
			d *= 2
		}
	}
	return min(d, time.Second)
}

// startMayLag reports whether msg is a start's work message that has not
// yet looked startLooks times for its run_created.
func startMayLag(msg jetstream.Msg) bool {
	if msg == nil || eventstore.WorkReason(msg) != "start" {
		return false
	}
	meta, err := msg.Metadata()
	return err == nil && meta.NumDelivered < startLooks
}

// readStart reads the journal of a start's work, looking again a few
// times when run_created is not there yet.
func (w *Worker) readStart(ctx context.Context, runID string) journalRead {
	var r journalRead
	r.evs, r.head, r.err = w.store.Read(ctx, runID)
	// A start's work message can come before its run_created,
	// published beside it (§8): look again at once, a few
	// times, before the message waits (journalDueDelay).
	for wait := 200 * time.Microsecond; errors.Is(r.err, eventstore.ErrRunNotFound) &&
		wait < 2*time.Millisecond && ctx.Err() == nil; wait *= 3 {
		sleep(ctx, wait)
		r.evs, r.head, r.err = w.store.Read(ctx, runID)
	}
	return r
}
