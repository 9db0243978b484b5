package workers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
)

// Causes with which a drive's context is cancelled.
var (
	errLeaseLost    = errors.New("lease lost: another worker owns the run")
	errLeaseExpired = errors.New("lease expired: could not renew it in time")
	errShutdown     = errors.New("worker shutting down")
	errOwnership    = errors.New("journal fenced: another worker resumed the run")
)

// keeper renews a drive's lease and keeps its work message alive. The
// moment the lease is lost, or its TTL passes without a successful
// renewal, it cancels the drive.
type keeper struct {
	leases *eventstore.Leases
	msg    jetstream.Msg
	cancel context.CancelCauseFunc

	mu    sync.Mutex
	lease eventstore.Lease

	stopOnce sync.Once
	stopc    chan struct{}
	done     chan struct{}
}

func startKeeper(ctx context.Context, leases *eventstore.Leases, lease *eventstore.Lease, msg jetstream.Msg, cancel context.CancelCauseFunc) *keeper {
	k := &keeper{leases: leases, msg: msg, cancel: cancel, lease: *lease,
		stopc: make(chan struct{}), done: make(chan struct{})}
	go k.run(ctx)
	return k
}

func (k *keeper) run(ctx context.Context) {
	defer close(k.done)
	every := k.lease.TTL() / 3
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-k.stopc:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if k.msg != nil {
			_ = k.msg.InProgress()
		}
		k.mu.Lock()
		l := k.lease
		k.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, every)
		err := k.leases.Renew(rctx, &l)
		cancel()
		switch {
		case err == nil:
			k.mu.Lock()
			k.lease = l
			k.mu.Unlock()
			t.Reset(every)
		case errors.Is(err, eventstore.ErrLeaseLost):
			k.cancel(errLeaseLost)
			return
		case !l.Valid(time.Now()):
			k.cancel(errLeaseExpired)
			return
		default:
			// A renewal that failed transiently (the bucket's leader is
			// being elected) is tried again soon, not a third of the TTL
			// later: a lease is kept through an election shorter than
			// what is left of its TTL.
			t.Reset(min(every, renewRetry))
		}
	}
}

// renewRetry is how soon a renewal that failed transiently is tried again.
const renewRetry = 100 * time.Millisecond

// valid reports whether the lease is certainly held now.
func (k *keeper) valid() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease.Valid(time.Now())
}

// stop ends the keeper and returns the lease as last renewed.
func (k *keeper) stop() eventstore.Lease {
	k.stopOnce.Do(func() { close(k.stopc) })
	<-k.done
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease
}
