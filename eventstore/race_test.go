package eventstore_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// TestAppendRace has several writers append to one run at once, two
// events per call, each fenced on the head it last read and starting over
// from LastHead when it loses. Every event lands exactly once and the
// journal stays gapless. Packed, the two events of a call land together or
// not at all; unpacked, a call that loses after its first event reports
// that one as landed through the head it returns.
func TestAppendRace(t *testing.T) {
	t.Parallel()
	for _, packed := range []bool{false, true} {
		t.Run(packName(packed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventstore.Config{}, eventstore.WithPacking(packed))
			ctx := t.Context()
			const run = "run_race"
			const writers, each = 6, 50

			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for w := range writers {
				wg.Go(func() {
					s := b.openStore(t, eventstore.WithPacking(packed))
					queue := make([]event.Event, each)
					for i := range queue {
						queue[i] = event.Event{Kind: event.ApprovalReceived, WorkerID: fmt.Sprintf("w%d", w),
							Data: json.RawMessage(fmt.Sprintf(`{"w":%d,"i":%d}`, w, i))}
					}
					for len(queue) > 0 {
						h, err := s.LastHead(ctx, run)
						if err != nil {
							errs <- err
							return
						}
						n := min(2, len(queue))
						got, err := s.Append(ctx, run, h, queue[:n]...)
						var ce *eventstore.ConflictError
						if err != nil && !errors.As(err, &ce) {
							errs <- err
							return
						}
						landed := int(got.Seq - h.Seq)
						if err == nil && landed != n || err != nil && (landed >= n || packed && landed != 0) {
							errs <- fmt.Errorf("append of %d events at seq %d: head moved by %d, err %v", n, h.Seq, landed, err)
							return
						}
						queue = queue[landed:]
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}

			evs, h, err := b.store.Read(ctx, run)
			require.NoError(t, err)
			require.Equal(t, writers*each, len(evs))
			require.Equal(t, uint64(writers*each), h.Seq)
			seen := map[string]int{}
			for i, e := range evs {
				require.Equal(t, uint64(i+1), e.Seq)
				seen[string(e.Data)]++
			}
			require.Equal(t, writers*each, len(seen), "every event exactly once")
		})
	}
}

// TestLeaseAcquireRace has many owners acquire one lease at once: exactly
// one wins, every other one is told who holds it.
func TestLeaseAcquireRace(t *testing.T) {
	t.Parallel()
	_, l := openLeases(t)
	ctx := t.Context()
	const owners = 16
	var wg sync.WaitGroup
	won := make(chan string, owners)
	held := make(chan string, owners)
	errs := make(chan error, owners)
	for i := range owners {
		wg.Go(func() {
			owner := fmt.Sprintf("w%d", i)
			_, err := l.Acquire(ctx, "run_l", owner)
			var he *eventstore.LeaseHeldError
			switch {
			case err == nil:
				won <- owner
			case errors.As(err, &he):
				held <- he.Owner
			default:
				errs <- err
			}
		})
	}
	wg.Wait()
	close(won)
	close(held)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, won, 1)
	winner := <-won
	require.Len(t, held, owners-1)
	for h := range held {
		require.Contains(t, []string{winner, "another worker"}, h)
	}
	requireHeldBy(t, l, "run_l", winner)
}
