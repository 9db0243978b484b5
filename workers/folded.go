package workers

import (
	"sync"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/eventstore"
)

// Bounds of the folded-state cache: runs kept, and how long one is kept.
const (
	foldedMax = 64
	foldedTTL = 10 * time.Minute
)

// folded is a run's state as a drive of this worker left it when it
// parked: folded through head, with the trace ids of its drives. The next
// drive of the run here reads only what came after head (a decision, a
// signal, a timer's wake) and folds that, instead of the whole journal.
type folded struct {
	st      *engine.RunState
	head    eventstore.Head
	earlier []string
	at      time.Time
}

// foldedCache holds the states of the runs this worker parked last. A
// state is taken out for a drive (one drive owns it) and put back when the
// drive parks again.
type foldedCache struct {
	mu    sync.Mutex
	runs  map[string]*folded
	order []foldedAt // insertion order, for eviction; may hold taken states
	hits  int        // drives that started from a cached state (tests)
}

type foldedAt struct {
	id string
	f  *folded
}

// take removes and returns run runID's state, or nil.
func (c *foldedCache) take(runID string, now time.Time) *folded {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.runs[runID]
	if !ok {
		return nil
	}
	delete(c.runs, runID)
	if now.Sub(f.at) > foldedTTL {
		return nil
	}
	return f
}

// put keeps run runID's state, evicting the oldest beyond foldedMax.
func (c *foldedCache) put(runID string, f *folded) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[string]*folded{}
	}
	c.runs[runID] = f
	c.order = append(c.order, foldedAt{runID, f})
	for len(c.runs) > foldedMax {
		o := c.order[0]
		c.order = c.order[1:]
		if c.runs[o.id] == o.f {
			delete(c.runs, o.id)
		}
	}
	if len(c.order) > 4*foldedMax {
		// Drop the entries of states taken or replaced since.
		live := c.order[:0]
		for _, o := range c.order {
			if c.runs[o.id] == o.f {
				live = append(live, o)
			}
		}
		c.order = live
	}
}

func (c *foldedCache) hit() {
	c.mu.Lock()
	c.hits++
	c.mu.Unlock()
}
