package workers

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
)

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
