package workers

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
)

// The lease of a drive.
//
// Every drive, top-level or an inline child, runs inside withLease: it
// takes the run's lease (waiting out a crashed holder's), drives under a
// keeper that renews the lease and keeps the work message alive
// (keeper.go), with a context cancelled the moment the lease is lost, and
// then disposes of the message and the lease by the drive's outcome
// (outcome.go).
//
// The speculative lease: a fresh run's first delivery (firstDrive) takes
// its lease while the drive reads, folds and flushes its run_resumed, one
// round trip less before the first step (docs/architecture.md §10.2). No
// drive of such a run can have begun (the start's work message is the
// run's only one), and the rule that keeps it safe lives here, in
// awaitLease, which the drive calls before anything but the flush that
// carries run_resumed leaves the process (flush, corrupt, unfoldable, a
// fold that shows a drive begun after all): nothing acts without the lease
// in hand. A token that lands without it only makes the lease's holder,
// which has not acted either, resume again on top of it; this drive then
// acts on nothing and hands the message back (driveBusy). A drive that
// needed no lease (the run had ended, or waits) gives back the one taken
// meanwhile.

// driveLease is what the lease job holds of a drive.
type driveLease struct {
	// keeper renews the lease once the drive holds it; nil before.
	keeper *keeper
	// taking is the lease a fresh run's first drive is taking (the
	// speculative lease); nil once awaitLease has its answer, and for
	// every other drive, which holds the lease before it starts.
	taking *pendingLease
	// msg is the work message the keeper keeps alive; nil outside the
	// work queue.
	msg jetstream.Msg
}

// expired reports whether the drive's lease may have run out: it must
// append nothing more.
func (l *driveLease) expired() bool { return l.keeper != nil && !l.keeper.valid() }

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

// firstDrive reports whether work message msg is a run's start, taken for
// the first time: no drive of the run can have begun, nor snapshotted it.
func firstDrive(msg jetstream.Msg) bool {
	if msg == nil || eventstore.WorkReason(msg) != "start" {
		return false
	}
	meta, err := msg.Metadata()
	return err == nil && meta.NumDelivered == 1
}

// withLease drives d under the run's lease, as the comment above says,
// and settles msg and the lease by the outcome's disposition. msg is nil
// for a drive outside the work queue (Drive, an inline child).
func (w *Worker) withLease(ctx context.Context, d *drive, msg jetstream.Msg) driveEnd {
	start := time.Now()
	rctx, stopRead := context.WithCancel(ctx)
	defer stopRead()
	read := w.readAhead(rctx, d, msg)
	d.lease.msg = msg
	var lease *eventstore.Lease
	if firstDrive(msg) {
		d.lease.taking, d.from.read = w.takeLease(ctx, d.runID), read
	} else {
		var waited bool
		var err error
		lease, waited, err = w.acquire(ctx, d.runID, msg)
		if !waited {
			// The journal may have moved while a crashed holder's lease
			// ran out: a read begun before that is not used.
			d.from.read = read
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
		d.lease.keeper = startKeeper(dctx, w.leases, lease, msg, cancel)
	}
	err := d.safeRun(msg)
	if p := d.lease.taking; p != nil {
		// The drive needed no lease: the one taken meanwhile is given back.
		d.lease.taking = nil
		<-p.done
		if p.err == nil {
			d.lease.keeper = startKeeper(dctx, w.leases, p.lease, msg, cancel)
		}
	}
	end := driveEnd{acquired: true, err: err, cause: context.Cause(dctx), stopped: ctx.Err(), journalDue: startMayLag(msg)}
	var held *eventstore.Lease
	if d.lease.keeper != nil {
		l := d.lease.keeper.stop()
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

// takeLease sends the Acquire of the speculative lease and returns it
// under way.
func (w *Worker) takeLease(ctx context.Context, runID string) *pendingLease {
	p := &pendingLease{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.lease, p.err = w.leases.Acquire(ctx, runID, w.owner)
	}()
	return p
}

// awaitLease waits for the speculative lease and starts its keeper; a
// *noLeaseError when it went to another worker. It returns nil at once
// for a drive that holds its lease already.
func (d *drive) awaitLease() error {
	p := d.lease.taking
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
	case <-d.ctx.Done():
		return context.Cause(d.ctx)
	}
	d.lease.taking = nil
	if p.err != nil {
		return &noLeaseError{err: p.err}
	}
	d.lease.keeper = startKeeper(d.ctx, d.w.leases, p.lease, d.lease.msg, d.cancel)
	return nil
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
