package workers

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/receipt"
)

// UnsignedSource lists ended runs the read side has no receipt for,
// oldest first.
type UnsignedSource interface {
	Unsigned(ctx context.Context, limit int) ([]string, error)
}

// MaxReceiptsPerPass bounds how many receipts one sweep signs.
const MaxReceiptsPerPass = 20

// DefaultRecoveryInterval is how often the recovery sweep runs.
const DefaultRecoveryInterval = 30 * time.Second

// MaxOrphansPerPass bounds how many runs one sweep re-enqueues.
const MaxOrphansPerPass = 20

// OrphanSource lists runs the read side believes are running or queued,
// oldest update first. The recovery sweep checks each against the lease
// bucket and the work queue, which are the truth.
type OrphanSource interface {
	Orphans(ctx context.Context, limit int) ([]string, error)
}

// Sweeper is the recovery sweep: a safety net that re-enqueues runs that
// nothing is driving — running or queued, with no live lease and no pending
// work message (a start that crashed before enqueueing, a work message lost
// with a dead server, a bug). Any number of replicas may sweep at once:
// a run has at most one pending work message and one lease, so two
// sweepers never make two workers drive one run.
type Sweeper struct {
	store    *eventstore.Store
	leases   *eventstore.Leases
	src      OrphanSource
	interval time.Duration
	log      *slog.Logger

	unsigned UnsignedSource
	receipts *receipt.Store
	key      *receipt.Key

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewSweeper returns a sweep that runs every interval (see
// RecoveryInterval for parsing PAL_RECOVERY_INTERVAL).
func NewSweeper(store *eventstore.Store, leases *eventstore.Leases, src OrphanSource, interval time.Duration, log *slog.Logger) *Sweeper {
	if interval <= 0 {
		interval = DefaultRecoveryInterval
	}
	if log == nil {
		log = slog.Default()
	}
	return &Sweeper{store: store, leases: leases, src: src, interval: interval, log: log.With("component", "recovery-sweep")}
}

// RecoveryInterval parses a PAL_RECOVERY_INTERVAL value. Empty, invalid
// or non-positive values give the 30 s default and, for the latter two, a
// warning to log: the sweep cannot be disabled.
func RecoveryInterval(v string) (time.Duration, string) {
	if v == "" {
		return DefaultRecoveryInterval, ""
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return DefaultRecoveryInterval, "PAL_RECOVERY_INTERVAL=" + v + " is not a Go duration; using 30s"
	}
	if d <= 0 {
		return DefaultRecoveryInterval, "PAL_RECOVERY_INTERVAL=" + v + " is not positive; using 30s (the sweep cannot be disabled)"
	}
	return d, ""
}

// Start runs the sweep every interval until Stop.
func (s *Sweeper) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done != nil {
		return errors.New("sweeper already started")
	}
	ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n, err := s.SweepOnce(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				s.log.Warn("the recovery sweep failed; it runs again at its next interval", "err", err)
			case n > 0:
				s.log.Info("recovery sweep re-enqueued orphaned runs", "runs", n)
			}
			if n, err := s.SignMissing(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("the recovery sweep could not sign missing receipts; it tries again at its next interval", "err", err)
			} else if n > 0 {
				s.log.Info("recovery sweep signed missing run receipts", "runs", n)
			}
		}
	}()
	s.log.Info("recovery sweep started", "interval", s.interval)
	return nil
}

// Stop ends the sweep and waits for a pass in progress. It is idempotent.
func (s *Sweeper) Stop(ctx context.Context) error {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// candidatesPerPass is how many candidates one pass examines, so runs that
// are alive and well cannot crowd real orphans out of the 20.
const candidatesPerPass = 200

// SweepOnce runs one pass and returns how many runs it re-enqueued (at
// most MaxOrphansPerPass).
func (s *Sweeper) SweepOnce(ctx context.Context) (int, error) {
	ids, err := s.src.Orphans(ctx, candidatesPerPass)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		if n >= MaxOrphansPerPass {
			break
		}
		holder, err := s.leases.Holder(ctx, id)
		if err != nil {
			return n, err
		}
		if holder != "" {
			continue
		}
		q, err := s.store.QueueOf(ctx, id)
		if err != nil {
			s.log.Warn("reading an orphan's queue", "run_id", id, "err", err)
			continue
		}
		pending, err := s.store.WorkPending(ctx, q, id)
		if err != nil {
			return n, err
		}
		if pending {
			continue
		}
		if err := s.store.Enqueue(ctx, q, id, "sweep"); err != nil {
			return n, err
		}
		s.log.Info("re-enqueued orphaned run", "run_id", id)
		n++
	}
	return n, nil
}

// WithReceipts makes the sweep sign the receipts of ended runs that have
// none (a worker died between the terminal event and the put, a run was
// cancelled while no worker drove it, or the run ended before signing was
// configured). Call it before Start.
func (s *Sweeper) WithReceipts(src UnsignedSource, rs *receipt.Store, key *receipt.Key) *Sweeper {
	s.unsigned, s.receipts, s.key = src, rs, key
	return s
}

// SignMissing signs up to MaxReceiptsPerPass missing receipts and returns
// how many it stored or found stored. Store.Ensure is a KV create, so a
// sweep racing the run's worker (or another sweep) leaves one receipt.
func (s *Sweeper) SignMissing(ctx context.Context) (int, error) {
	if s.unsigned == nil || s.receipts == nil || s.key == nil {
		return 0, nil
	}
	ids, err := s.unsigned.Unsigned(ctx, MaxReceiptsPerPass)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		if _, err := s.receipts.Ensure(ctx, s.key, id); err != nil {
			// One bad journal must not stop the others being signed.
			s.log.Warn("signing a run receipt", "run_id", id, "err", err)
			continue
		}
		n++
	}
	return n, nil
}
