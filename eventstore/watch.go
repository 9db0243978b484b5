package eventstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
)

// ErrStopWatch may be returned by a Watch callback to end the watch
// without an error.
var ErrStopWatch = errors.New("stop watching")

// WatchPrefix is the subject prefix PAL_EVENTS republishes every stored
// message on (pal.watch.<run_id>), with its stream sequence and the
// sequence of the run's message before it: the live half of Watch.
const WatchPrefix = "pal.watch."

// WatchSubject is the subject a run's stored messages are republished on.
func WatchSubject(runID string) string { return WatchPrefix + runID }

// watchBuffer is how many republished messages one watch holds before
// the server's copies are dropped; a drop is caught up from the stream.
const watchBuffer = 64

// watchResync is how long a watch may hear nothing before it checks the
// run's head: a copy lost on a reconnect (or republished before this
// watch's interest reached the stream leader's server) is then caught up.
const watchResync = 10 * time.Second

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
// A watch costs one core NATS subscription on the run's WatchSubject and
// no JetStream consumer: it reads the history with batched Direct Gets,
// then takes the stream's republished copies, de-duplicated by stream
// sequence. A copy that does not follow the watch's head directly (one was
// dropped, or it is no sound continuation) is not trusted: the watch reads
// the stream from its head instead.
func (s *Store) Watch(ctx context.Context, runID string, after Head, fn func(event.Event) error) error {
	return s.watchRun(ctx, runID, after, fn, nil)
}

// WatchWithDeltas is Watch that also calls onDelta with the run's deltas
// (the text LLM steps stream, as WatchDeltas gives them). Both come in
// the order they were published: the journal's copies and the deltas
// share one subscription channel, so a call's deltas come before the
// step_completed that ends it (the worker publishes them first, on the
// connection it appends with). The history comes first: the journal after
// the head, then the deltas PAL_DELTAS holds (a finished call's included:
// event.Streamed.End tells them apart). fn and onDelta are called from
// one goroutine.
func (s *Store) WatchWithDeltas(ctx context.Context, runID string, after Head, fn func(event.Event) error,
	onDelta func(event.Delta) error) error {
	if onDelta == nil {
		return s.watchRun(ctx, runID, after, fn, nil)
	}
	return s.watchRun(ctx, runID, after, fn, &deltaWatch{s: s, runID: runID, fn: onDelta})
}

// watchRun is Watch, and WatchWithDeltas when dw is set.
func (s *Store) watchRun(ctx context.Context, runID string, after Head, fn func(event.Event) error, dw *deltaWatch) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("watching: %w", err)
	}
	size := watchBuffer
	if dw != nil {
		size = deltaBuffer
	}
	ch := make(chan *nats.Msg, size)
	// Subscribed before the history is read, so nothing stored after the
	// read is missed.
	sub, err := s.js.Conn().ChanSubscribe(WatchSubject(runID), ch)
	if err != nil {
		return fmt.Errorf("watching run %s: %w", runID, err)
	}
	closed := make(chan struct{})
	var once sync.Once
	sub.SetClosedHandler(func(string) { once.Do(func() { close(closed) }) })
	defer func() { _ = sub.Unsubscribe() }()
	var dsub *nats.Subscription
	if dw != nil {
		// The same channel: the deltas and the journal's copies in the
		// order the server sent them.
		if dsub, err = s.js.Conn().ChanSubscribe(DeltaSubject(runID), ch); err != nil {
			return fmt.Errorf("watching the deltas of run %s: %w", runID, err)
		}
		defer func() { _ = dsub.Unsubscribe() }()
	}
	w := watch{s: s, runID: runID, head: after, chain: after.chain(runID), fn: fn}
	if err := w.catchUp(ctx); err != nil {
		return w.result(err)
	}
	var settle <-chan time.Time // the deltas' second read (deltaSettle)
	if dw != nil {
		if err := dw.catchUp(ctx); err != nil {
			return dw.result(err)
		}
		t := time.NewTimer(deltaSettle)
		defer t.Stop()
		settle = t.C
	}
	dropped, deltasDropped := 0, 0
	idle := time.NewTimer(watchResync)
	defer idle.Stop()
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-settle:
			if err := dw.catchUp(ctx); err != nil {
				return dw.result(err)
			}
			continue
		case m = <-ch:
		case <-closed:
			if err := ctx.Err(); err != nil {
				return err
			}
			return fmt.Errorf("watching run %s: the subscription closed (the connection closed)", runID)
		case <-idle.C:
		}
		idle.Reset(watchResync)
		if m == nil {
			h, err := s.LastHead(ctx, runID)
			if err == nil && h.StreamSeq > w.head.StreamSeq {
				err = w.catchUp(ctx)
			}
			if err != nil {
				return w.result(err)
			}
			continue
		}
		if n, _ := sub.Dropped(); n != dropped {
			dropped = n
			if err := w.catchUp(ctx); err != nil {
				return w.result(err)
			}
		}
		if dw != nil {
			if n, _ := dsub.Dropped(); n != deltasDropped {
				deltasDropped = n
				if err := dw.catchUp(ctx); err != nil {
					return dw.result(err)
				}
			}
			if m.Sub == dsub {
				if err := dw.take(ctx, m.Data); err != nil {
					return dw.result(err)
				}
				continue
			}
		}
		if err := w.take(ctx, m); err != nil {
			return w.result(err)
		}
	}
}

// watch is one Watch's position in the run's journal.
type watch struct {
	s     *Store
	runID string
	head  Head
	chain event.Chain
	fn    func(event.Event) error
}

// errWatchEnded carries fn's error (or ErrStopWatch) out of a read.
type errWatchEnded struct{ err error }

func (e errWatchEnded) Error() string { return e.err.Error() }

// result turns what ended the watch into Watch's return value.
func (w *watch) result(err error) error {
	var end errWatchEnded
	if errors.As(err, &end) {
		if errors.Is(end.err, ErrStopWatch) {
			return nil
		}
		return end.err
	}
	return err
}

// deliver passes a message's events to fn.
func (w *watch) deliver(evs []event.Event) error {
	for _, ev := range evs {
		if err := w.fn(ev); err != nil {
			return errWatchEnded{err}
		}
	}
	return nil
}

// take applies a republished copy if it directly follows the head and is
// a sound continuation, and otherwise reads the stream from the head.
func (w *watch) take(ctx context.Context, m *nats.Msg) error {
	seq, err := strconv.ParseUint(served(m.Header, jetstream.SequenceHeader), 10, 64)
	if err != nil || served(m.Header, jetstream.StreamHeader) != EventsStream {
		return nil // not a republished copy
	}
	if seq <= w.head.StreamSeq {
		return nil // read already
	}
	prev, err := strconv.ParseUint(served(m.Header, "Nats-Last-Sequence"), 10, 64)
	if err != nil || prev != w.head.StreamSeq || w.chain.Corrupt != nil {
		return w.catchUp(ctx)
	}
	c := w.chain
	evs, _ := c.NextStamped(m.Data, StampOf(m.Header, Answered))
	if c.Corrupt != nil {
		// Not the stream's own copy, or the journal is bad: the stream
		// says which.
		return w.catchUp(ctx)
	}
	w.chain, w.head = c, after(&c, seq)
	return w.deliver(evs)
}

// catchUp reads and passes on everything stored after the head.
func (w *watch) catchUp(ctx context.Context) error {
	var ended error
	err := w.s.scan(ctx, w.runID, w.head.StreamSeq, 0, func(streamSeq uint64, body []byte, st event.Stamp) bool {
		// A message that does not verify is skipped, and so is everything
		// after it but the seal (event.Chain).
		evs, _ := w.chain.NextStamped(body, st)
		w.head = after(&w.chain, streamSeq)
		ended = w.deliver(evs)
		return ended == nil
	})
	if ended != nil {
		return ended
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("watching run %s: %w", w.runID, err)
	}
	return nil
}
