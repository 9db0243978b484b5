package engine

import (
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"sync"

	"github.com/palrun/pal/workflow"
)

// parseCache keeps recently parsed workflow snapshots, keyed by hash, so
// folding many runs of one workflow parses it once. Parsing is pure, so the
// cache does not change any result.
var parseCache = newLRU(256)

type lruEntry struct {
	key string
	wf  *workflow.Workflow
	err error
}

type lru struct {
	mu    sync.Mutex
	cap   int
	ll    *list.List
	items map[string]*list.Element
}

func newLRU(n int) *lru { return &lru{cap: n, ll: list.New(), items: map[string]*list.Element{}} }

func parseCached(hash string, raw []byte) (*workflow.Workflow, error) {
	if hash == "" {
		sum := sha256.Sum256(raw)
		hash = hex.EncodeToString(sum[:])
	}
	// The hash is the writer's claim; key on the content too so a wrong
	// hash cannot alias another workflow.
	key := hash + ":" + string(raw)
	c := parseCache
	c.mu.Lock()
	if el, ok := c.items[key]; ok {
		c.ll.MoveToFront(el)
		e := el.Value.(*lruEntry)
		c.mu.Unlock()
		return e.wf, e.err
	}
	c.mu.Unlock()
	wf, err := workflow.Parse(raw)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[key]; !ok {
		c.items[key] = c.ll.PushFront(&lruEntry{key: key, wf: wf, err: err})
		if c.ll.Len() > c.cap {
			old := c.ll.Back()
			c.ll.Remove(old)
			delete(c.items, old.Value.(*lruEntry).key)
		}
	}
	return wf, err
}
