package eventstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// TestAppendAndReadAcrossRestarts appends to a run and reads it while the
// JetStream server restarts several times. Every call either succeeds once
// the server is back or ends with its context; afterwards the journal holds
// every appended event exactly once, without gaps.
func TestAppendAndReadAcrossRestarts(t *testing.T) {
	t.Parallel()
	for _, packed := range []bool{false, true} {
		t.Run(packName(packed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventstore.Config{}, eventstore.WithPacking(packed), eventstore.WithRequestTimeout(250*time.Millisecond))
			ctx := timeout(t, 45*time.Second)
			const run = "run_restart"
			const total = 400

			progress := make(chan uint64, total)
			var wg sync.WaitGroup
			var (
				writeErr error
				final    eventstore.Head
			)
			wg.Go(func() {
				defer close(progress)
				h := eventstore.Head{}
				for n := 1; n <= total; n += 2 {
					next, err := b.store.Append(ctx, run, h, ev(event.ApprovalReceived, n), ev(event.ApprovalReceived, n+1))
					if err != nil {
						writeErr = err
						return
					}
					if next.Seq != h.Seq+2 {
						writeErr = errors.New("append moved the head by the wrong amount")
						return
					}
					h = next
					progress <- h.Seq
				}
				final = h
			})

			// A reader keeps reading while the server comes and goes. Each
			// Read has a short deadline: it returns the journal's prefix or
			// its context's error, nothing else.
			readerStop := make(chan struct{})
			var (
				reads, readTimeouts int
				readErr             error
			)
			wg.Go(func() {
				for {
					select {
					case <-readerStop:
						return
					default:
					}
					rctx, cancel := context.WithTimeout(ctx, time.Second)
					evs, h, err := b.store.Read(rctx, run)
					cancel()
					switch {
					case err == nil:
						reads++
						if uint64(len(evs)) != h.Seq {
							readErr = errors.New("read returned a head that does not match its events")
							return
						}
						for i, e := range evs {
							if e.Seq != uint64(i+1) || dataN(t, e) != i+1 || e.RunID != run {
								readErr = errors.New("read returned a gap, a duplicate or a foreign event")
								return
							}
						}
					case errors.Is(err, eventstore.ErrRunNotFound):
					case errors.Is(err, context.DeadlineExceeded):
						readTimeouts++
					default:
						readErr = err
						return
					}
				}
			})

			seen := uint64(0)
			for _, at := range []uint64{40, 120, 200, 300} {
				for seen < at {
					s, ok := <-progress
					require.True(t, ok, "writer stopped: %v", writeErr)
					seen = s
				}
				b.srv.Restart(t)
			}
			for range progress {
			}
			close(readerStop)
			wg.Wait()
			require.NoError(t, writeErr)
			require.NoError(t, readErr)
			t.Logf("%d reads succeeded, %d timed out", reads, readTimeouts)
			require.Positive(t, reads)

			evs, h, err := b.store.Read(ctx, run)
			require.NoError(t, err)
			requireJournal(t, run, evs, total)
			require.Equal(t, final, h)
			want := uint64(total)
			if packed {
				want = total / 2
			}
			require.Equal(t, want, b.msgCount(t, eventstore.EventsStream), "one message per append, no duplicate")
		})
	}
}

// TestAppendWhileServerDown ends with the context's error when the server
// does not come back in time, and the append can be retried afterwards.
func TestAppendWhileServerDown(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{}, eventstore.WithRequestTimeout(200*time.Millisecond))
	const run = "run_down"
	h, err := b.store.Append(t.Context(), run, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)

	b.srv.Shutdown()
	// The same slice for the retry: Append stamps ts into it, so the retry
	// sends the very same message.
	evs := []event.Event{ev(event.ApprovalReceived, 2)}
	_, err = b.store.Append(timeout(t, 700*time.Millisecond), run, h, evs...)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, _, err = b.store.Read(timeout(t, 700*time.Millisecond), run)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	b.srv.Restart(t)
	// The retry with the same event: whether or not the first try reached
	// the server, the event is in the journal once.
	h, err = b.store.Append(timeout(t, 20*time.Second), run, h, evs...)
	require.NoError(t, err)
	require.Equal(t, uint64(2), h.Seq)
	read, rh, err := b.store.Read(timeout(t, 20*time.Second), run)
	require.NoError(t, err)
	requireJournal(t, run, read, 2)
	require.Equal(t, h, rh)
}
