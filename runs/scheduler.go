package runs

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/palrun/pal/eventstore"
)

// Scheduler fires schedules' ticks (docs/architecture.md §10.11). Every
// worker process runs one; they do not divide the schedules between them:
// each watches PAL_SCHEDULES and, when a tick is due, starts its run
// through the Client (Start, as every start), then moves the schedule's
// LastTick with a revision-checked update. Two that fire one tick start
// one run: its id is derived from the schedule and the tick
// (event.ScheduleRunID), and run_created is appended once. So a worker
// killed at any point costs no tick while another runs, and a tick is
// fired again, never lost, when the one firing it dies before it moved
// LastTick.
type Scheduler struct {
	c   *Client
	log *slog.Logger
	now func() time.Time

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// SchedulerOption configures a Scheduler.
type SchedulerOption func(*Scheduler)

// WithSchedulerClock sets the scheduler's clock (default time.Now).
func WithSchedulerClock(now func() time.Time) SchedulerOption {
	return func(s *Scheduler) { s.now = now }
}

// WithSchedulerLogger sets where fired, skipped and failed ticks are
// logged (default slog.Default()).
func WithSchedulerLogger(l *slog.Logger) SchedulerOption {
	return func(s *Scheduler) { s.log = l }
}

// NewScheduler returns a Scheduler that starts runs through c.
func NewScheduler(c *Client, opts ...SchedulerOption) *Scheduler {
	s := &Scheduler{c: c, log: slog.Default(), now: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s
}

// retryAfter is how long a schedule whose tick failed to start (NATS
// unavailable, the creator over its limits) waits before it is tried
// again.
const retryAfter = time.Second

// Start watches PAL_SCHEDULES and fires ticks until ctx ends or Stop.
func (s *Scheduler) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		return errors.New("scheduler already started")
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	type update struct {
		sc      eventstore.Schedule
		deleted bool
	}
	updates := make(chan update)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := s.c.store.WatchSchedules(ctx, func(sc eventstore.Schedule, deleted bool) bool {
				select {
				case updates <- update{sc, deleted}:
					return true
				case <-ctx.Done():
					return false
				}
			}, func() bool { return true })
			if err != nil && ctx.Err() == nil {
				s.log.Warn("watching schedules", "err", err)
			}
			select { // the watch ended (a reconnect): watch again
			case <-ctx.Done():
			case <-time.After(retryAfter):
			}
		}
	}()
	go func() {
		defer close(s.done)
		defer wg.Wait()
		all := map[string]eventstore.Schedule{}
		held := map[string]time.Time{} // schedule → not before (after a failure)
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for {
			now := s.now()
			wake := now.Add(time.Hour)
			for name, sc := range all {
				if sc.Paused {
					continue
				}
				k, err := clockOf(sc)
				if err != nil {
					continue
				}
				at := k.next(sc.LastTick)
				if h, ok := held[name]; ok && at.Before(h) {
					at = h
				}
				if !at.After(now) {
					if err := s.fire(ctx, &sc, k, now); err != nil {
						if ctx.Err() != nil {
							return
						}
						s.log.Warn("schedule tick not started; trying again", "schedule", name, "err", err)
						held[name] = now.Add(retryAfter)
						at = now.Add(retryAfter)
					} else {
						delete(held, name)
						all[name] = sc
						at = k.next(sc.LastTick)
					}
				}
				if at.Before(wake) {
					wake = at
				}
			}
			timer.Reset(wake.Sub(s.now()))
			select {
			case <-ctx.Done():
				return
			case u := <-updates:
				if u.deleted {
					delete(all, u.sc.Name)
				} else if old, ok := all[u.sc.Name]; !ok || u.sc.Revision > old.Revision {
					all[u.sc.Name] = u.sc
				}
			case <-timer.C:
			}
		}
	}()
	return nil
}

// Stop ends the scheduler and waits for it. It may be called more than
// once.
func (s *Scheduler) Stop(ctx context.Context) error {
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

// fire starts the runs of sc's due ticks as its catchup says, then moves
// its LastTick past them (sc is updated to what is stored). A start that
// fails leaves LastTick where it was, so the ticks are fired again.
func (s *Scheduler) fire(ctx context.Context, sc *eventstore.Schedule, k clock, now time.Time) error {
	max := 1
	if sc.Catchup == CatchupAll {
		max = MaxCatchup
	}
	due := k.due(sc.LastTick, now, max)
	if len(due) == 0 {
		return nil
	}
	last := due[len(due)-1]
	fire := due
	if sc.Catchup == CatchupNone {
		// Only a tick fired in time: within the grace, and before half
		// the wait for the next one.
		grace := min(catchupGrace, k.next(last).Sub(last)/2)
		if now.Sub(last) > grace {
			fire = nil
			s.log.Info("schedule ticks missed, not caught up (catchup none)", "schedule", sc.Name, "last", last)
		}
	}
	if len(fire) > 0 && sc.Overlap == OverlapSkip && sc.LastRun != "" && s.running(ctx, sc.LastRun) {
		s.log.Info("schedule tick skipped: its last run has not ended (overlap skip)", "schedule", sc.Name, "tick", last, "run_id", sc.LastRun)
		fire = nil
	}
	lastRun := sc.LastRun
	for _, t := range fire {
		id, err := s.c.startTick(ctx, *sc, t, sc.By)
		if code, _, final := Classify(err); err != nil && (!final || code == CodeRateLimited) {
			return err // passing: the ticks stay due and are tried again
		} else if err != nil {
			// Refused for good (the creator lost a right, the input no
			// longer fits the workflow): trying again cannot help, so the
			// tick is passed over, said loudly.
			s.log.Error("schedule tick refused; passed over", "schedule", sc.Name, "tick", t, "code", code, "err", err)
			continue
		}
		lastRun = id
	}
	for range 10 {
		next := *sc
		next.LastTick, next.LastRun = last, lastRun
		out, err := s.c.store.UpdateSchedule(ctx, next)
		if err == nil {
			*sc = out
			return nil
		}
		if !errors.Is(err, eventstore.ErrScheduleChanged) {
			return err
		}
		// Another worker (or a command) changed it first: take what is
		// stored; if it has moved as far, there is nothing left to do.
		cur, err := s.c.store.GetSchedule(ctx, sc.Name)
		if err != nil {
			return err
		}
		*sc = cur
		if !cur.LastTick.Before(last) || cur.Paused {
			return nil
		}
	}
	return errors.New("schedule kept changing meanwhile")
}

// running reports whether run runID has not ended (a run not found has
// not started: not running; a read that fails counts as running, so
// skip errs on the side of not overlapping).
func (s *Scheduler) running(ctx context.Context, runID string) bool {
	ev, h, err := s.c.store.LastEvent(ctx, runID)
	if errors.Is(err, eventstore.ErrRunNotFound) || (err == nil && h.Seq == 0) {
		return false
	}
	return err != nil || !ev.Kind.Terminal()
}
