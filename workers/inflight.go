package workers

import (
	"context"
	"sync"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// inflightGrace is how old an index entry with no journal must be before
// the sweep removes it: its start may still be appending run_created.
const inflightGrace = time.Minute

// InflightSource finds orphan candidates with NATS alone: the runs in the
// PAL_INFLIGHT index (eventstore.InflightBucket), which names every run
// from just before its run_created to its end, so a pass reads the runs in
// flight and never the finished ones. Entries of finished runs whose purge
// was lost, and of starts that never appended run_created, are removed on
// the way. Passes go round the index, so runs that are alive and well
// cannot crowd the rest out.
type InflightSource struct {
	store *eventstore.Store

	mu   sync.Mutex
	next uint64 // the revision the next pass starts from
}

// NewInflightSource returns the NATS-only orphan source.
func NewInflightSource(store *eventstore.Store) *InflightSource {
	return &InflightSource{store: store}
}

// Orphans returns up to limit runs in flight that are not parked on an
// outside input, from where the last pass stopped.
func (s *InflightSource) Orphans(ctx context.Context, limit int) ([]string, error) {
	all, err := s.store.InflightRuns(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	from := s.next
	s.mu.Unlock()
	start := 0
	for start < len(all) && all[start].Revision < from {
		start++
	}
	var out []string
	next := uint64(0) // wrap round unless this pass stops early
	for i := range all {
		e := all[(start+i)%len(all)]
		if len(out) == limit {
			next = e.Revision
			break
		}
		last, head, err := s.store.LastEvent(ctx, e.RunID)
		if err != nil {
			return out, err
		}
		switch {
		case head.Seq == 0:
			if time.Since(e.Created) > inflightGrace {
				_ = s.store.UnmarkInflight(ctx, e.RunID)
			}
		case last.Kind.Terminal():
			_ = s.store.UnmarkInflight(ctx, e.RunID)
		case last.Kind == event.StepWaiting:
			// Parked on an approval or a child: its input enqueues it.
		default:
			out = append(out, e.RunID)
		}
	}
	s.mu.Lock()
	s.next = next
	s.mu.Unlock()
	return out, nil
}

// Sources merges orphan sources: each is asked in turn, and a run named
// twice is returned once.
func Sources(srcs ...OrphanSource) OrphanSource { return multiSource(srcs) }

type multiSource []OrphanSource

func (m multiSource) Orphans(ctx context.Context, limit int) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, src := range m {
		ids, err := src.Orphans(ctx, limit)
		if err != nil {
			return out, err
		}
		for _, id := range ids {
			if !seen[id] {
				seen[id] = true
				out = append(out, id)
			}
		}
	}
	return out, nil
}
