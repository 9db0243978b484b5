package eventstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// deltaLog is a watcher's view: the deltas it was given, in order.
type deltaLog struct {
	mu     sync.Mutex
	deltas []event.Delta
	grew   chan struct{}
}

func newDeltaLog() *deltaLog { return &deltaLog{grew: make(chan struct{}, 1)} }

func (l *deltaLog) add(d event.Delta) error {
	l.mu.Lock()
	l.deltas = append(l.deltas, d)
	l.mu.Unlock()
	select {
	case l.grew <- struct{}{}:
	default:
	}
	return nil
}

// waitLen waits until the log holds n deltas.
func (l *deltaLog) waitLen(t *testing.T, n int) []event.Delta {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		l.mu.Lock()
		got := append([]event.Delta(nil), l.deltas...)
		l.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-l.grew:
		case <-ctx.Done():
			t.Fatalf("watcher has %d deltas, want %d: %+v", len(got), n, got)
		}
	}
}

// watchDeltas runs WatchDeltas in the background until the test ends.
func watchDeltas(t *testing.T, s *eventstore.Store, runID string) *deltaLog {
	t.Helper()
	l := newDeltaLog()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.WatchDeltas(ctx, runID, l.add) }()
	t.Cleanup(func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
	return l
}

func words(call uint64, from, to int) []event.Delta {
	var out []event.Delta
	for i := from; i < to; i++ {
		out = append(out, event.Delta{StepID: "ask", Attempt: 1, Call: call, Index: i, Text: fmt.Sprintf(" w%d", i),
			Kind: event.DeltaText, Reset: i == 0})
	}
	return out
}

func text(ds []event.Delta) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString(d.Text)
	}
	return b.String()
}

// TestWatchDeltasHistoryThenLive: a watcher that arrives in the middle of
// a step first gets the text so far from PAL_DELTAS, then the live
// deltas: both watchers see the same deltas, in order, none twice. A
// later call of the step (a resumed one) starts with a reset.
func TestWatchDeltasHistoryThenLive(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	const run = "run_deltas"
	early := watchDeltas(t, b.store, run)
	publish := func(ds []event.Delta) {
		for _, d := range ds {
			require.NoError(t, b.store.PublishDelta(run, d))
		}
	}
	publish(words(5, 0, 50))
	early.waitLen(t, 50)
	require.Eventually(t, func() bool { return b.msgCount(t, eventstore.DeltasStream) == 50 }, 5*time.Second, time.Millisecond)

	late := watchDeltas(t, b.openStore(t), run)
	require.Len(t, late.waitLen(t, 50), 50, "the text so far")
	publish(words(5, 50, 100))
	a, l := early.waitLen(t, 100), late.waitLen(t, 100)
	require.Equal(t, a, l)
	require.Equal(t, text(words(5, 0, 100)), text(a), "in order, no gap, no duplicate")

	// The step is resumed: its new call begins with a reset.
	publish(words(9, 0, 3))
	a = early.waitLen(t, 103)
	require.True(t, a[100].Reset)
	require.Equal(t, uint64(9), a[100].Call)
	require.Equal(t, a, late.waitLen(t, 103))

	// Other runs' deltas are not theirs; a delta over the bound is refused.
	require.NoError(t, b.store.PublishDelta("run_other", words(1, 0, 1)[0]))
	require.Error(t, b.store.PublishDelta(run, event.Delta{StepID: "ask", Text: strings.Repeat("x", event.MaxDeltaText+1)}))
	require.Error(t, b.store.PublishDelta("a.b", words(1, 0, 1)[0]))
	publish(words(9, 3, 4))
	require.Len(t, early.waitLen(t, 104), 104)
}

// TestWatchDeltasCatchesUpWhatItDropped: a watcher too slow for the live
// deltas (its buffer full, the client drops the rest) reads what it
// missed from PAL_DELTAS: it still gets every delta, in order, once.
func TestWatchDeltasCatchesUpWhatItDropped(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	const run = "run_slow"
	release := make(chan struct{})
	l := newDeltaLog()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	started := make(chan struct{})
	var once sync.Once
	go func() {
		done <- b.openStore(t).WatchDeltas(ctx, run, func(d event.Delta) error {
			once.Do(func() { close(started) })
			if d.Index == 0 {
				<-release // slow: the live deltas pile up meanwhile
			}
			return l.add(d)
		})
	}()
	ds := words(7, 0, 3000)
	// The first delta is live (the watch subscribes before it reads): wait
	// until the watch took it, then bury it.
	require.Eventually(t, func() bool {
		_ = b.store.PublishDelta(run, ds[0])
		select {
		case <-started:
			return true
		default:
			return false
		}
	}, 10*time.Second, 10*time.Millisecond)
	for _, d := range ds[1:] {
		require.NoError(t, b.store.PublishDelta(run, d))
	}
	require.NoError(t, b.nc.Flush())
	require.Eventually(t, func() bool { return b.msgCount(t, eventstore.DeltasStream) >= 3000 }, 10*time.Second, time.Millisecond)
	close(release)
	got := l.waitLen(t, 3000)
	require.Equal(t, text(ds), text(got), "every delta, in order, once")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

// TestWatchWithDeltasKeepsTheWriterOrder: a writer that publishes a
// call's deltas and then appends the step_completed that ends it, on one
// connection, is watched in that order: every delta before the event,
// from the start and from a watch that begins in the middle.
func TestWatchWithDeltasKeepsTheWriterOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	const run = "run_order"
	h := begin(t, b.store, run)
	type item struct {
		delta *event.Delta
		kind  event.Kind
	}
	watchBoth := func(s *eventstore.Store) (func() []item, func()) {
		var mu sync.Mutex
		var items []item
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- s.WatchWithDeltas(ctx, run, eventstore.Head{}, func(ev event.Event) error {
				mu.Lock()
				defer mu.Unlock()
				items = append(items, item{kind: ev.Kind})
				return nil
			}, func(d event.Delta) error {
				mu.Lock()
				defer mu.Unlock()
				items = append(items, item{delta: &d})
				return nil
			})
		}()
		return func() []item {
				mu.Lock()
				defer mu.Unlock()
				return append([]item(nil), items...)
			}, func() {
				cancel()
				require.ErrorIs(t, <-done, context.Canceled)
			}
	}
	first, stopFirst := watchBoth(b.openStore(t))
	defer stopFirst()
	for _, d := range words(h.Seq, 0, 20) {
		require.NoError(t, b.store.PublishDelta(run, d))
	}
	require.Eventually(t, func() bool { return len(first()) >= 22 }, 10*time.Second, time.Millisecond)
	late, stopLate := watchBoth(b.openStore(t))
	defer stopLate()
	require.Eventually(t, func() bool { return len(late()) >= 22 }, 10*time.Second, time.Millisecond)
	for _, d := range words(h.Seq, 20, 200) {
		require.NoError(t, b.store.PublishDelta(run, d))
	}
	done := event.MustNew(event.StepCompleted, "ask", 1, event.StepCompletedData{Output: json.RawMessage(`{"text":"x"}`)})
	done.WorkerID = "w1"
	_, err := b.store.Append(t.Context(), run, h, done)
	require.NoError(t, err)
	for name, got := range map[string]func() []item{"first": first, "late": late} {
		require.Eventually(t, func() bool {
			items := got()
			return len(items) > 0 && items[len(items)-1].kind == event.StepCompleted
		}, 10*time.Second, time.Millisecond, name)
		var ds []event.Delta
		for _, it := range got()[2:] { // after run_created and run_resumed
			if it.delta == nil {
				break
			}
			ds = append(ds, *it.delta)
		}
		require.Equal(t, text(words(h.Seq, 0, 200)), text(ds), "%s: every delta, in order, before step_completed", name)
	}
}
