package eventstore_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// TestTenThousandWatches: 10,000 watches at once (100 runs, 100 each), as
// a busy API's event feeds hold, take no JetStream consumer, stay within a
// few KiB each, and all see the next event.
func TestTenThousandWatches(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 watches: not in -short")
	}
	b := setup(t, eventstore.Config{})
	// Minutes, not seconds: under the race detector on a loaded 2-core
	// machine, 10,000 catch-up reads have taken 95 s.
	ctx := timeout(t, 5*time.Minute)
	const runs, per = 100, 100
	ids := make([]string, runs)
	heads := make([]eventstore.Head, runs)
	for i := range ids {
		ids[i] = event.NewRunID()
		h, err := b.store.Append(ctx, ids[i], eventstore.Head{}, ev(event.RunCreated, 1))
		require.NoError(t, err)
		heads[i] = h
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	var caughtUp, done sync.WaitGroup
	caughtUp.Add(runs * per)
	done.Add(runs * per)
	var failed atomic.Int64
	for _, id := range ids {
		for range per {
			go func() {
				defer done.Done()
				// A watch that fails before its first event still counts
				// as caught up, so that the wait below ends and the test
				// reports the failure rather than hanging.
				var seen bool
				defer func() {
					if !seen {
						caughtUp.Done()
					}
				}()
				err := b.store.Watch(ctx, id, eventstore.Head{}, func(e event.Event) error {
					switch e.Seq {
					case 1:
						if !seen {
							seen = true
							caughtUp.Done()
						}
						return nil
					case 2:
						return eventstore.ErrStopWatch
					}
					return nil
				})
				if err != nil {
					failed.Add(1)
					t.Errorf("watch of %s: %v", id, err)
				}
			}()
		}
	}
	caughtUp.Wait()
	require.Zero(t, failed.Load(), "every watch caught up")
	var during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&during)
	grown := int64(during.HeapInuse+during.StackInuse) - int64(before.HeapInuse+before.StackInuse)
	perWatch := grown / (runs * per)
	t.Logf("10,000 watches: %d KiB in all, %d B per watch (heap and stacks, the test's goroutines included)", grown>>10, perWatch)
	require.Less(t, perWatch, int64(24<<10), "memory per watch")
	info, err := b.stream(t, eventstore.EventsStream).Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Consumers, "a watch took a JetStream consumer")

	for i, id := range ids {
		_, err := b.store.Append(ctx, id, heads[i], ev(event.RunResumed, 2))
		require.NoError(t, err)
	}
	wait := make(chan struct{})
	go func() { done.Wait(); close(wait) }()
	select {
	case <-wait:
	case <-ctx.Done():
		t.Fatal("not every watch saw the second event")
	}
	require.Zero(t, failed.Load())
}

// TestWatchSurvivesABadCopy: a copy on the watch subject that is not a
// sound continuation (here published by hand, with the republish headers
// of a message that follows the head) is not passed on and does not spoil
// the watch: it reads the stream instead, and takes the next real event.
func TestWatchSurvivesABadCopy(t *testing.T) {
	b := setup(t, eventstore.Config{})
	ctx := timeout(t, time.Minute)
	run := event.NewRunID()
	h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1), ev(event.RunResumed, 2))
	require.NoError(t, err)
	w := startWatch(ctx, b.store, run, eventstore.Head{}, nil)
	require.Equal(t, uint64(1), w.next(t).Seq)
	require.Equal(t, uint64(2), w.next(t).Seq)

	bad := &nats.Msg{Subject: eventstore.WatchSubject(run), Data: []byte(`{"v":1,"seq":3,"kind":"run_succeeded"}`), Header: nats.Header{}}
	bad.Header.Set(jetstream.StreamHeader, eventstore.EventsStream)
	bad.Header.Set(jetstream.SequenceHeader, fmt.Sprint(h.StreamSeq+1))
	bad.Header.Set(jetstream.LastSequenceHeader, fmt.Sprint(h.StreamSeq))
	require.NoError(t, b.nc.PublishMsg(bad))
	require.NoError(t, b.nc.Flush())

	_, err = b.store.Append(ctx, run, h, ev(event.StepStarted, 3))
	require.NoError(t, err)
	got := w.next(t)
	require.Equal(t, uint64(3), got.Seq)
	require.Equal(t, event.StepStarted, got.Kind)
	require.Equal(t, 3, dataN(t, got))
}
