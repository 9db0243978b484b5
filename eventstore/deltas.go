package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/palrun/pal/event"
)

// Deltas: the text of LLM steps as it streams (event.Delta), for watchers,
// never the journal. The worker publishes each delta with a plain core
// NATS publish on DeltaSubject(run): no ack is awaited, so a call's
// stream never waits on JetStream, and the publish goes out on the
// connection the worker appends with, so every watcher gets a call's
// deltas before the step_completed that ends it. The memory stream
// PAL_DELTAS keeps what is published for DeltasMaxAge, so a watcher that
// arrives in the middle of a step first reads the text so far, then takes
// the live deltas (WatchDeltas). Core NATS alone would give a late
// watcher only what comes after it arrived; a file stream would write to
// disk what the journal keeps anyway.

// Names of the deltas' stream and subjects (public interface,
// docs/architecture.md §5).
const (
	DeltasStream = "PAL_DELTAS"
	// DeltaPrefix is the subject prefix of a run's deltas:
	// pal.deltas.<run_id>.
	DeltaPrefix = "pal.deltas."
)

// Bounds of PAL_DELTAS: it is memory, and holds only what a watcher that
// arrives mid-step needs.
const (
	// DeltasMaxAge is how long a delta is kept: longer than any step's
	// call (PAL's LLM default timeout is 2 minutes).
	DeltasMaxAge = 10 * time.Minute
	// DeltasMaxPerRun bounds what one run keeps (the oldest go first): a
	// 32k-token answer is some 32,000 deltas.
	DeltasMaxPerRun = 50_000
	// DeltasMaxBytes bounds the whole stream (the oldest go first).
	DeltasMaxBytes = 256 << 20
	// deltaMaxMsg bounds one message: a delta's text is at most
	// event.MaxDeltaText.
	deltaMaxMsg = event.MaxDeltaText + 1<<10
)

// DeltaSubject is the subject of a run's deltas.
func DeltaSubject(runID string) string { return DeltaPrefix + runID }

// PublishDelta publishes d on its run's delta subject, without waiting for
// anything: a delta that does not arrive (no connection, a full stream)
// is lost, and the journal's step_completed has the whole answer all the
// same. d's text must be at most event.MaxDeltaText bytes.
func (s *Store) PublishDelta(runID string, d event.Delta) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("publishing a delta: %w", err)
	}
	if len(d.Text) > event.MaxDeltaText {
		return fmt.Errorf("publishing a delta of run %s step %s: %d bytes of text, over %d", runID, d.StepID, len(d.Text), event.MaxDeltaText)
	}
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return s.js.Conn().Publish(DeltaSubject(runID), b)
}

// deltaBuffer is how many live deltas one watch holds before the
// server's copies are dropped; a drop is caught up from the stream.
const deltaBuffer = 1024

// deltaBatch is how many stored deltas one Direct Get reads.
const deltaBatch = 256

// deltaSettle is when a watch reads PAL_DELTAS a second time after its
// first read: a delta published before the watch's subscription reached
// the server, and stored only after that first read, would otherwise wait
// for the next live delta (and the last deltas of a call have none).
// Every delta published later reaches the subscription.
const deltaSettle = time.Second

// WatchDeltas calls fn with every delta of a run that PAL_DELTAS holds
// (the text so far of the steps being written), then with every delta
// published after, until ctx ends or fn returns an error: in the order of
// each step's calls, each delta once, a call's deltas without a gap
// (event.Streamed decides). It returns nil when fn returned ErrStopWatch,
// ctx.Err() when ctx ended, fn's error when fn failed, and an error when
// the watch itself ended (the connection closed).
//
// It subscribes to the run's delta subject before it reads the stream, so
// nothing published after the read is missed; a delta that arrives after
// one it has not seen (dropped, or published before the subscription but
// not yet stored when the stream was read) makes it read the stream
// again, and so does deltaSettle passing after the first read. A delta
// the stream no longer holds is given up for: the next one is passed on
// all the same.
func (s *Store) WatchDeltas(ctx context.Context, runID string, fn func(event.Delta) error) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("watching deltas: %w", err)
	}
	ch := make(chan *nats.Msg, deltaBuffer)
	sub, err := s.js.Conn().ChanSubscribe(DeltaSubject(runID), ch)
	if err != nil {
		return fmt.Errorf("watching the deltas of run %s: %w", runID, err)
	}
	closed := make(chan struct{})
	var once sync.Once
	sub.SetClosedHandler(func(string) { once.Do(func() { close(closed) }) })
	defer func() { _ = sub.Unsubscribe() }()

	w := deltaWatch{s: s, runID: runID, fn: fn}
	if err := w.catchUp(ctx); err != nil {
		return w.result(err)
	}
	settle := time.NewTimer(deltaSettle)
	defer settle.Stop()
	dropped := 0
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-settle.C:
			if err := w.catchUp(ctx); err != nil {
				return w.result(err)
			}
			continue
		case m = <-ch:
		case <-closed:
			if err := ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("watching the deltas of run %s: the subscription closed (the connection closed)", runID)
		}
		if n, _ := sub.Dropped(); n != dropped {
			dropped = n
			if err := w.catchUp(ctx); err != nil {
				return w.result(err)
			}
		}
		if err := w.take(ctx, m.Data); err != nil {
			return w.result(err)
		}
	}
}

// deltaWatch is one WatchDeltas' view of the run's steps.
type deltaWatch struct {
	s     *Store
	runID string
	fn    func(event.Delta) error
	seen  event.Streamed
}

func (w *deltaWatch) result(err error) error {
	if errors.Is(err, ErrStopWatch) {
		return nil
	}
	return err
}

// take passes on one live delta if it is new, reading the stream first
// when one before it is missing.
func (w *deltaWatch) take(ctx context.Context, data []byte) error {
	var d event.Delta
	if json.Unmarshal(data, &d) != nil {
		return nil // not PAL's: nothing a watcher can show
	}
	switch w.seen.Apply(d) {
	case event.DeltaNew:
		return w.fn(d)
	case event.DeltaGap:
		if err := w.catchUp(ctx); err != nil {
			return err
		}
		switch w.seen.Apply(d) {
		case event.DeltaNew:
			return w.fn(d)
		case event.DeltaGap:
			w.seen.Force(d)
			return w.fn(d)
		}
	}
	return nil
}

// catchUp reads every delta the stream holds for the run and passes on
// those that are new, in order. A stored delta after a missing one (the
// stream let it go) is passed on all the same.
func (w *deltaWatch) catchUp(ctx context.Context) error {
	seq := uint64(1)
	for {
		n := 0
		err := w.s.directBatch(ctx, DeltasStream, directRequest{Seq: seq, NextBySubj: DeltaSubject(w.runID), Batch: deltaBatch},
			deltaBatch, func(m directMsg) error {
				n++
				seq = m.Sequence + 1
				var d event.Delta
				if json.Unmarshal(m.Data, &d) != nil {
					return nil
				}
				switch w.seen.Apply(d) {
				case event.DeltaNew:
					return w.fn(d)
				case event.DeltaGap:
					w.seen.Force(d)
					return w.fn(d)
				}
				return nil
			})
		switch {
		case errors.Is(err, errNoMessages):
			return nil
		case err != nil:
			return fmt.Errorf("reading the deltas of run %s: %w", w.runID, err)
		case n < deltaBatch:
			return nil
		}
	}
}
