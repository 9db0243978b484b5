package eventstore_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// watch runs Store.Watch in a goroutine, passing every event to the test;
// fn's answer for an event is stop(event).
type watch struct {
	evs  chan event.Event
	done chan error
}

func startWatch(ctx context.Context, s *eventstore.Store, run string, after eventstore.Head, stop func(event.Event) error) *watch {
	w := &watch{evs: make(chan event.Event, 1000), done: make(chan error, 1)}
	go func() {
		w.done <- s.Watch(ctx, run, after, func(e event.Event) error {
			w.evs <- e
			if stop == nil {
				return nil
			}
			return stop(e)
		})
	}()
	return w
}

// next waits for the watcher's next event.
func (w *watch) next(t *testing.T) event.Event {
	t.Helper()
	select {
	case e := <-w.evs:
		return e
	case err := <-w.done:
		w.done <- err // for wait
		select {
		case e := <-w.evs: // fn saw it before Watch returned
			return e
		default:
		}
		require.FailNow(t, "watch ended early", "error: %v", err)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "no event from the watch in 10s")
	}
	return event.Event{}
}

// wait waits for Watch to return.
func (w *watch) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-w.done:
		return err
	case <-time.After(10 * time.Second):
		require.FailNow(t, "watch did not return in 10s")
	}
	return nil
}

func stopAt(seq uint64) func(event.Event) error {
	return func(e event.Event) error {
		if e.Seq == seq {
			return eventstore.ErrStopWatch
		}
		return nil
	}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	packed := b.openStore(t, eventstore.WithPacking(true))
	const run = "run_watch"

	h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1), ev(event.RunResumed, 2))
	require.NoError(t, err)
	after := h
	h, err = packed.Append(ctx, run, h, ev(event.StepStarted, 3), ev(event.StepCompleted, 4))
	require.NoError(t, err)
	_, err = b.store.Append(ctx, "run_noise", eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)

	w := startWatch(ctx, b.store, run, after, stopAt(12))
	// What was there before the watch started…
	for seq := uint64(3); seq <= 4; seq++ {
		e := w.next(t)
		require.Equal(t, seq, e.Seq)
		require.Equal(t, run, e.RunID)
		require.Equal(t, int(seq), dataN(t, e))
	}
	// …then what is appended while watching, one by one and packed, with
	// another run's events in between.
	for n := 5; n <= 12; n += 2 {
		s := b.store
		if n%4 == 1 {
			s = packed
		}
		h, err = s.Append(ctx, run, h, ev(event.StepStarted, n), ev(event.StepCompleted, n+1))
		require.NoError(t, err)
		_, err = b.store.Append(ctx, "run_noise_"+itoa(n), eventstore.Head{}, ev(event.RunCreated, 1))
		require.NoError(t, err)
		for seq := uint64(n); seq <= uint64(n+1); seq++ {
			e := w.next(t)
			require.Equal(t, seq, e.Seq)
			require.Equal(t, int(seq), dataN(t, e))
		}
	}
	require.NoError(t, w.wait(t), "ErrStopWatch ends the watch without an error")
	require.Empty(t, w.evs)

	// More events reach no one: the watch is over.
	_, err = b.store.Append(ctx, run, h, ev(event.RunSucceeded, 13))
	require.NoError(t, err)
}

func TestWatchFromStart(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{}, eventstore.WithPacking(true))
	ctx := t.Context()
	const run = "run_watch"

	// The run does not exist yet when the watch starts.
	w := startWatch(ctx, b.store, run, eventstore.Head{}, stopAt(5))
	h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	require.Equal(t, uint64(1), w.next(t).Seq)
	_, err = b.store.Append(ctx, run, h, ev(event.RunResumed, 2), ev(event.StepStarted, 3), ev(event.StepCompleted, 4), ev(event.RunSucceeded, 5))
	require.NoError(t, err)
	for seq := uint64(2); seq <= 5; seq++ {
		require.Equal(t, seq, w.next(t).Seq)
	}
	require.NoError(t, w.wait(t))

	// A second watch from the start sees the whole run again.
	w = startWatch(ctx, b.store, run, eventstore.Head{}, stopAt(5))
	for seq := uint64(1); seq <= 5; seq++ {
		require.Equal(t, seq, w.next(t).Seq)
	}
	require.NoError(t, w.wait(t))
}

func TestWatchCanceled(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	const run = "run_watch"
	h, err := b.store.Append(t.Context(), run, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	w := startWatch(ctx, b.store, run, eventstore.Head{}, nil)
	require.Equal(t, uint64(1), w.next(t).Seq)
	cancel()
	require.ErrorIs(t, w.wait(t), context.Canceled)

	// A deadline ends it with the deadline's error.
	dctx, dcancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer dcancel()
	w = startWatch(dctx, b.store, run, h, nil)
	require.ErrorIs(t, w.wait(t), context.DeadlineExceeded)
	require.Empty(t, w.evs)
}

func TestWatchCallbackError(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const run = "run_watch"
	_, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1), ev(event.RunResumed, 2), ev(event.StepStarted, 3))
	require.NoError(t, err)

	boom := errors.New("projector failed")
	w := startWatch(ctx, b.store, run, eventstore.Head{}, func(e event.Event) error {
		if e.Seq == 2 {
			return boom
		}
		return nil
	})
	err = w.wait(t)
	require.ErrorIs(t, err, boom)
	require.Len(t, w.evs, 2, "no event after the one fn failed on")

	// A wrapped ErrStopWatch stops quietly too.
	w = startWatch(ctx, b.store, run, eventstore.Head{}, func(e event.Event) error {
		return errors.Join(errors.New("done"), eventstore.ErrStopWatch)
	})
	require.NoError(t, w.wait(t))
	require.Len(t, w.evs, 1)
}

// jetstreamGoroutines counts the goroutines of the JetStream client and of
// this package (the embedded server's own are not counted).
func jetstreamGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "nats.go/jetstream.") || strings.Contains(g, "eventstore.(*Store).Watch") {
			count++
		}
	}
	return count
}

// TestWatchLeavesNoGoroutines is not parallel: it counts goroutines while
// no other test runs.
func TestWatchLeavesNoGoroutines(t *testing.T) {
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const run = "run_watch"
	_, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	base := jetstreamGoroutines()

	settled := func(what string) {
		t.Helper()
		eventually(t, 5*time.Second, 10*time.Millisecond, func() bool { return jetstreamGoroutines() <= base },
			"goroutines left behind by a watch that %s: %d, before %d", what, jetstreamGoroutines(), base)
	}

	w := startWatch(ctx, b.store, run, eventstore.Head{}, stopAt(1))
	require.NoError(t, w.wait(t))
	settled("stopped")

	cctx, cancel := context.WithCancel(ctx)
	w = startWatch(cctx, b.store, run, eventstore.Head{}, nil)
	w.next(t)
	require.Greater(t, jetstreamGoroutines(), base, "a running watch shows up in the count")
	cancel()
	require.ErrorIs(t, w.wait(t), context.Canceled)
	settled("was canceled")

	w = startWatch(ctx, b.store, run, eventstore.Head{}, func(event.Event) error { return errors.New("fail") })
	require.Error(t, w.wait(t))
	settled("failed")
}

// TestWatchAcrossRestart keeps watching while the server restarts: the
// watch resumes where it was, without a gap or a repeat.
func TestWatchAcrossRestart(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{}, eventstore.WithRequestTimeout(500*time.Millisecond))
	ctx := timeout(t, 40*time.Second)
	const run = "run_watch"
	h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1), ev(event.RunResumed, 2))
	require.NoError(t, err)

	w := startWatch(ctx, b.store, run, eventstore.Head{}, stopAt(6))
	require.Equal(t, uint64(1), w.next(t).Seq)
	require.Equal(t, uint64(2), w.next(t).Seq)

	b.srv.Restart(t)
	h, err = b.store.Append(ctx, run, h, ev(event.StepStarted, 3), ev(event.StepCompleted, 4))
	require.NoError(t, err)
	require.Equal(t, uint64(3), w.next(t).Seq)
	require.Equal(t, uint64(4), w.next(t).Seq)

	b.srv.Restart(t)
	_, err = b.store.Append(ctx, run, h, ev(event.StepStarted, 5), ev(event.RunSucceeded, 6))
	require.NoError(t, err)
	require.Equal(t, uint64(5), w.next(t).Seq)
	require.Equal(t, uint64(6), w.next(t).Seq)
	require.NoError(t, w.wait(t))
	require.Empty(t, w.evs)
}

// TestWatchConnClosed: a watch whose connection closes under it ends with
// an error, not with nil (which means fn asked to stop).
func TestWatchConnClosed(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	const run = "run_watch"
	_, err := b.store.Append(t.Context(), run, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)

	nc := b.srv.Conn(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	s, err := eventstore.Open(t.Context(), js)
	require.NoError(t, err)
	w := startWatch(timeout(t, 20*time.Second), s, run, eventstore.Head{}, nil)
	require.Equal(t, uint64(1), w.next(t).Seq)
	nc.Close()
	err = w.wait(t)
	require.Error(t, err)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
}
