package workers

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/receipt"
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
// tally, if not nil, is the receipt's tally through head (end.go).
type folded struct {
	st      *engine.RunState
	head    eventstore.Head
	earlier []string
	tally   *receipt.Tally
}

// foldedCache holds the states of the runs this worker parked last, at
// most foldedMax, for foldedTTL each: an expirable LRU, which frees a
// state once its time is up. A state is taken out for a drive (one drive
// owns it) and put back when the drive parks again.
//
// golang-lru v2's expirable LRU expires its entries from a goroutine of
// its own that it never stops, one per worker (paltest/testenv's leak
// check knows it).
type foldedCache struct {
	mu   sync.Mutex // makes take's look and removal one
	lru  *expirable.LRU[string, *folded]
	hits atomic.Int64 // drives that started from a cached state (tests)
}

func newFoldedCache(size int, ttl time.Duration) *foldedCache {
	return &foldedCache{lru: expirable.NewLRU[string, *folded](size, nil, ttl)}
}

// take removes and returns run runID's state, or nil.
func (c *foldedCache) take(runID string) *folded {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.lru.Get(runID)
	if ok {
		c.lru.Remove(runID)
	}
	return f
}

// put keeps run runID's state, evicting the least recently kept beyond
// foldedMax.
func (c *foldedCache) put(runID string, f *folded) { c.lru.Add(runID, f) }

func (c *foldedCache) hit() { c.hits.Add(1) }
