package workers

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/retry"
)

// Start lag: a start's work message that comes before its run_created.
//
// The optimisation: a start publishes its run's work message beside
// run_created (eventstore.Store.AppendStart), not after run_created's ack,
// and waits for both acks at once: one round trip less per start
// (docs/architecture.md §8 step 3). The two go to different streams,
// stored apart, so a worker may take the work before the journal shows
// the run.
//
// Its compensation, all of it:
//
//   - The first delivery's read looks again at once (readStart, on
//     startLook: 200 µs, 600 µs and 1.8 ms on), as run_created is most
//     often a message behind.
//   - Then the drive ends as driveJournalDue and hands the work back
//     (nakSoonMsg) after journalDueDelay: 20 ms, doubling with each
//     delivery up to a second (startRedelivery), for startLooks
//     deliveries, as many as it takes the waits to add up to
//     eventstore.StartLag. They are counted by deliveries rather than by
//     the message's age, so that no clock's skew moves them. After that
//     the work is dropped as work for a run with no journal
//     (driveNoJournal): work whose start failed costs a few dozen looks.
//   - A start whose append took a third of StartLag (NATS unavailable for
//     a while) enqueues the run again once run_created landed
//     (AppendStart), so that work a worker gave up on is sent anew; that
//     is a no-op while the first work message is pending.
//   - If the work message is lost all the same, the recovery sweep queues
//     the run (docs/architecture.md §11.4).

// startLook paces readStart's looks, and startReads bounds them.
var startLook = retry.Policy{Initial: 200 * time.Microsecond, Max: 1800 * time.Microsecond, Multiplier: 3}

const startReads = 4

// readStart reads the journal of a start's work on its first delivery,
// looking again on startLook while run_created is not there yet.
func (w *Worker) readStart(ctx context.Context, runID string) journalRead {
	var r journalRead
	reads := 0
	_ = retry.Do(ctx, startLook, func() error {
		reads++
		r.evs, r.head, r.err = w.store.Read(ctx, runID)
		if errors.Is(r.err, eventstore.ErrRunNotFound) && reads < startReads {
			return r.err // look again
		}
		return nil // r is the read, whatever it found
	})
	return r
}

// startRedelivery paces the deliveries of a start's work that found no
// journal.
var startRedelivery = retry.Policy{Initial: 20 * time.Millisecond, Max: time.Second}

// startLooks is how many deliveries of a start's work may find no journal
// before the work is dropped: the waits between them add up to
// eventstore.StartLag (36 deliveries, some 30 s).
var startLooks = func() uint64 {
	n := uint64(1)
	for waited := time.Duration(0); waited < eventstore.StartLag; n++ {
		waited += startRedelivery.Wait(int(n))
	}
	return n
}()

// journalDueDelay is how long a start's work message that came before
// its run_created waits before its next delivery.
func journalDueDelay(msg jetstream.Msg) time.Duration {
	n := 1
	if meta, err := msg.Metadata(); err == nil {
		n = int(meta.NumDelivered)
	}
	return startRedelivery.Wait(n)
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
