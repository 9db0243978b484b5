package eventstore_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

func TestReadUnknownRun(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	_, err := b.store.Append(ctx, "run_known", eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)

	evs, h, err := b.store.Read(ctx, "run_unknown")
	require.ErrorIs(t, err, eventstore.ErrRunNotFound)
	require.Contains(t, err.Error(), "run_unknown")
	require.Empty(t, evs)
	require.Equal(t, eventstore.Head{}, h)

	evs, h, err = b.store.ReadAfter(ctx, "run_unknown", eventstore.Head{})
	require.NoError(t, err, "ReadAfter reports nothing new, not a missing run")
	require.Empty(t, evs)
	require.Equal(t, eventstore.Head{}, h)

	h, err = b.store.LastHead(ctx, "run_unknown")
	require.NoError(t, err)
	require.Equal(t, eventstore.Head{}, h)

	_, err = b.store.FirstEvent(ctx, "run_unknown")
	require.ErrorIs(t, err, eventstore.ErrRunNotFound)
}

// TestFirstEvent: a run's first event is its run_created, found with one
// Get however many messages came after it, on its subject and others.
func TestFirstEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	_, err := b.store.Append(ctx, "run_before", eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	h, err := b.store.Append(ctx, "run_first", eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	for i := 2; i <= 5; i++ {
		h, err = b.store.Append(ctx, "run_first", h, ev(event.StepStarted, i))
		require.NoError(t, err)
	}
	first, err := b.store.FirstEvent(ctx, "run_first")
	require.NoError(t, err)
	require.Equal(t, event.RunCreated, first.Kind)
	require.Equal(t, "run_first", first.RunID)
	require.Equal(t, uint64(1), first.Seq)
	_, err = b.store.FirstEvent(ctx, "run.x")
	require.ErrorIs(t, err, event.ErrInvalidRunID)
}

// TestReadLongRuns reads runs longer than several Direct Get batches,
// written one event per message, packed, and mixed, with their appends
// interleaved so each run's messages are scattered over the stream.
func TestReadLongRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	plain := b.store
	packed := b.openStore(t, eventstore.WithPacking(true))

	const events = 1700
	type writer struct {
		run   string
		store func(i int) *eventstore.Store
		size  func(i int) int // events per Append call
		head  eventstore.Head
	}
	ws := []*writer{
		{run: "run_plain", store: func(int) *eventstore.Store { return plain }, size: func(int) int { return 1 }},
		{run: "run_packed", store: func(int) *eventstore.Store { return packed }, size: func(i int) int { return 1 + i%3 }},
		{run: "run_mixed", store: func(i int) *eventstore.Store {
			if i%2 == 0 {
				return packed
			}
			return plain
		}, size: func(i int) int { return 1 + i%4 }},
	}
	for i := 0; ; i++ {
		busy := false
		for _, w := range ws {
			if w.head.Seq >= events {
				continue
			}
			busy = true
			n := min(w.size(i), events-int(w.head.Seq))
			batch := make([]event.Event, n)
			for j := range batch {
				batch[j] = ev(event.ApprovalReceived, int(w.head.Seq)+j+1)
			}
			h, err := w.store(i).Append(ctx, w.run, w.head, batch...)
			require.NoError(t, err)
			require.Equal(t, w.head.Seq+uint64(n), h.Seq)
			w.head = h
		}
		if !busy {
			break
		}
	}

	for _, w := range ws {
		for _, s := range []*eventstore.Store{plain, packed} {
			evs, h, err := s.Read(ctx, w.run)
			require.NoError(t, err, w.run)
			requireJournal(t, w.run, evs, events)
			require.Equal(t, w.head, h, w.run)

			last, err := s.LastHead(ctx, w.run)
			require.NoError(t, err)
			require.Equal(t, w.head, last, w.run)
		}
	}
	info, err := b.stream(t, eventstore.EventsStream).Info(ctx, jetstream.WithSubjectFilter(eventstore.EventsPrefix+">"))
	require.NoError(t, err)
	for _, w := range ws {
		require.Greater(t, info.State.Subjects[eventstore.EventsSubject(w.run)], uint64(512),
			"run %s must span several Direct Get batches", w.run)
	}
}

func TestReadAfter(t *testing.T) {
	t.Parallel()
	for _, packed := range []bool{false, true} {
		t.Run(packName(packed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventstore.Config{}, eventstore.WithPacking(packed))
			ctx := t.Context()
			const run = "run_after"
			var heads []eventstore.Head
			h := eventstore.Head{}
			for n := 1; n <= 600; n += 3 {
				var err error
				h, err = b.store.Append(ctx, run, h, ev(event.ApprovalReceived, n), ev(event.ApprovalReceived, n+1), ev(event.ApprovalReceived, n+2))
				require.NoError(t, err)
				heads = append(heads, h)
				// Another run's messages in between.
				_, err = b.store.Append(ctx, fmt.Sprintf("run_other%d", n), eventstore.Head{}, ev(event.RunCreated, 1))
				require.NoError(t, err)
			}
			final := h
			require.Equal(t, uint64(600), final.Seq)

			for _, mid := range []eventstore.Head{heads[0], heads[50], heads[len(heads)-2]} {
				evs, got, err := b.store.ReadAfter(ctx, run, mid)
				require.NoError(t, err)
				require.Equal(t, final, got)
				require.Len(t, evs, int(final.Seq-mid.Seq))
				for i, e := range evs {
					require.Equal(t, mid.Seq+uint64(i)+1, e.Seq)
					require.Equal(t, int(e.Seq), dataN(t, e))
					require.Equal(t, run, e.RunID)
				}
			}

			// At the end: nothing new, head unchanged.
			evs, got, err := b.store.ReadAfter(ctx, run, final)
			require.NoError(t, err)
			require.Empty(t, evs)
			require.Equal(t, final, got)

			// New events show up after the old head.
			h, err = b.store.Append(ctx, run, final, ev(event.RunSucceeded, 601))
			require.NoError(t, err)
			evs, got, err = b.store.ReadAfter(ctx, run, final)
			require.NoError(t, err)
			require.Equal(t, h, got)
			require.Len(t, evs, 1)
			require.Equal(t, uint64(601), evs[0].Seq)
			require.Equal(t, event.RunSucceeded, evs[0].Kind)
		})
	}
}

// TestReadManyRuns appends to many runs at once, including run ids that
// are prefixes of one another, and checks that no run sees another's
// events.
func TestReadManyRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	packed := b.openStore(t, eventstore.WithPacking(true))

	const runs, perRun = 24, 60
	heads := make([]eventstore.Head, runs)
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for r := range runs {
		wg.Go(func() {
			s := b.store
			if r%2 == 1 {
				s = packed
			}
			run := fmt.Sprintf("run_%d", r) // run_1, run_10, run_11 …
			h := eventstore.Head{}
			for n := 1; n <= perRun; n += 2 {
				var err error
				if h, err = s.Append(ctx, run, h, ev(event.ApprovalReceived, n), ev(event.ApprovalReceived, n+1)); err != nil {
					errs <- fmt.Errorf("%s: %w", run, err)
					return
				}
			}
			heads[r] = h
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for r := range runs {
		run := fmt.Sprintf("run_%d", r)
		evs, h, err := b.store.Read(ctx, run)
		require.NoError(t, err)
		requireJournal(t, run, evs, perRun)
		require.Equal(t, heads[r], h)
	}
}

func TestLastHead(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{}, eventstore.WithPacking(true))
	ctx := t.Context()
	const run = "run_head"
	h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	got, err := b.store.LastHead(ctx, run)
	require.NoError(t, err)
	require.Equal(t, h, got)

	_, err = b.store.Append(ctx, "run_between", eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	h, err = b.store.Append(ctx, run, h, ev(event.RunResumed, 2), ev(event.StepStarted, 3))
	require.NoError(t, err)
	got, err = b.store.LastHead(ctx, run)
	require.NoError(t, err)
	requireHead(t, 3, 3, got)
	require.Equal(t, h, got)

	// The head LastHead returns is one an append can be fenced on.
	_, err = b.store.Append(ctx, run, got, ev(event.StepCompleted, 4))
	require.NoError(t, err)
}
