package eventstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
)

// ErrStopWatch may be returned by a Watch callback to end the watch
// without an error.
var ErrStopWatch = errors.New("stop watching")

// Watch calls fn for every event of a run after the given head, in order,
// as they are appended, until ctx ends or fn returns an error. Pass the
// zero Head to start at the beginning. It returns nil when fn returned
// ErrStopWatch, ctx.Err() when ctx ended, fn's error when fn failed, and
// an error when the watch itself ended (the connection closed).
//
// Messages are verified as Read does (event.Chain): one that is not a
// sound continuation is never passed to fn, nor is any after it but the
// seal (run_failed, journal_corrupt) a worker appends.
//
// Watch uses an ordered consumer that the server removes shortly after the
// watcher goes away.
func (s *Store) Watch(ctx context.Context, runID string, after Head, fn func(event.Event) error) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("watching: %w", err)
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{EventsSubject(runID)},
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: 5 * time.Second,
	}
	if after.StreamSeq > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = after.StreamSeq + 1
	}
	cons, err := s.js.OrderedConsumer(ctx, EventsStream, cfg)
	if err != nil {
		return fmt.Errorf("watching run %s: %w", runID, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("watching run %s: %w", runID, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer func() {
		stop()
		it.Stop()
	}()
	chain := after.chain(runID)
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Closed under us (the connection closed) or failed: either
			// way not a stop fn asked for, so never nil.
			return fmt.Errorf("watching run %s: %w", runID, err)
		}
		// A message that does not verify is skipped, and so is everything
		// after it but the seal (event.Chain).
		evs, _ := chain.Next(m.Data())
		for _, ev := range evs {
			if err := fn(ev); err != nil {
				if errors.Is(err, ErrStopWatch) {
					return nil
				}
				return err
			}
		}
	}
}
