package workers_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/workers"
)

// journalOrphans is an OrphanSource over a fixed set of runs that, like a
// read side with no lag, offers those whose journal has not ended.
type journalOrphans struct {
	store *eventstore.Store
	ids   []string
}

func (s journalOrphans) Orphans(ctx context.Context, limit int) ([]string, error) {
	var out []string
	for _, id := range s.ids {
		evs, _, err := s.store.Read(ctx, id)
		if err != nil {
			return nil, err
		}
		if !evs[len(evs)-1].Kind.Terminal() && len(out) < limit {
			out = append(out, id)
		}
	}
	return out, nil
}

func TestRecoveryInterval(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]time.Duration{"": 30 * time.Second, "5s": 5 * time.Second, "250ms": 250 * time.Millisecond,
		"abc": 30 * time.Second, "0": 30 * time.Second, "-3s": 30 * time.Second} {
		got, warn := workers.RecoveryInterval(v)
		require.Equal(t, want, got, v)
		require.Equal(t, v != "" && v != "5s" && v != "250ms", warn != "", v)
	}
}

// createOrphan writes run_created without a work message, as a start that
// crashed between the two would leave it.
func createOrphan(t *testing.T, b *bundle, wf string) string {
	t.Helper()
	runID := event.NewRunID()
	ev := event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(wf), Input: json.RawMessage(`{}`)})
	ev.WorkerID = "test"
	_, err := b.Store.Append(context.Background(), runID, eventstore.Head{}, ev)
	require.NoError(t, err)
	return runID
}

func TestTwoSweepersRaceOnFiftyOrphans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var ids []string
	for range 50 {
		ids = append(ids, createOrphan(t, b, echoChain(3)))
	}
	for _, id := range ids {
		pending, err := b.Store.WorkPending(ctx, "", id)
		require.NoError(t, err)
		require.False(t, pending)
	}
	b.worker(t, "w1", nil)
	src := journalOrphans{store: b.Store, ids: ids}
	a := workers.NewSweeper(b.Store, b.Leases, src, time.Hour, paltest.Logger(t))
	c := workers.NewSweeper(b.Store, b.Leases, src, time.Hour, paltest.Logger(t))
	total := 0
	for pass := 0; pass < 3; pass++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, s := range []*workers.Sweeper{a, c} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := s.SweepOnce(ctx)
				require.NoError(t, err)
				require.LessOrEqual(t, n, workers.MaxOrphansPerPass)
				mu.Lock()
				total += n
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	require.GreaterOrEqual(t, total, 50)
	for _, id := range ids {
		require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
		require.Len(t, find(b.Events(t, id), event.RunResumed, ""), 1, "run %s driven more than once", id)
	}
}
