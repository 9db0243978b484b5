package eventstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/retry"
)

// ScheduleWake asks JetStream to wake a run at t: a scheduled message in
// PAL_TIMERS (pal.timer.at.<run_id>.<n>) that the server republishes on
// pal.timer.fire.<run_id> when t comes, for a worker to enqueue the run.
// n tells one timer of the run from another (the seq of its step_waiting).
// Timers survive restarts of every process; a timer that fires for a run
// with nothing to do wakes it for nothing.
func (s *Store) ScheduleWake(ctx context.Context, runID string, n uint64, t time.Time) error {
	if err := event.ValidateRunID(runID); err != nil {
		return err
	}
	subj := fmt.Sprintf("%s%s.%d", timerAtPrefix, runID, n)
	msg := &nats.Msg{Subject: subj, Data: []byte(runID), Header: nats.Header{}}
	return retry.Do(ctx, jsRetry, func() error {
		pctx, cancel := context.WithTimeout(ctx, s.timeout)
		_, err := s.js.PublishMsg(pctx, msg, jetstream.WithExpectStream(TimersStream),
			jetstream.WithScheduleAt(t), jetstream.WithScheduleTarget(timerFirePrefix+runID))
		cancel()
		if err == nil {
			return nil
		}
		err = fmt.Errorf("scheduling a wake-up of run %s: %w", runID, err)
		if !transient(err) {
			return retry.Permanent(err)
		}
		return err
	})
}

// RunIDFromTimer extracts the run id from a fired timer's subject.
func RunIDFromTimer(subject string) (string, bool) {
	id, ok := strings.CutPrefix(subject, timerFirePrefix)
	return id, ok && event.ValidateRunID(id) == nil
}

// TimerConsumer returns the durable consumer of fired timers.
func (s *Store) TimerConsumer(ctx context.Context) (jetstream.Consumer, error) {
	c, err := s.js.Consumer(ctx, TimersStream, TimerConsumer)
	if err != nil {
		return nil, fmt.Errorf("opening consumer %s: %w", TimerConsumer, err)
	}
	return c, nil
}
