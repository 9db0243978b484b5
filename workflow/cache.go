package workflow

import (
	"container/list"
	"crypto/sha256"
	"sync"
)

// parseCacheSize bounds the workflows ParseCached keeps.
const parseCacheSize = 512

var parseCache = struct {
	sync.Mutex
	ll    *list.List
	items map[[32]byte]*list.Element
}{ll: list.New(), items: map[[32]byte]*list.Element{}}

type cachedParse struct {
	key [32]byte
	wf  *Workflow
	err error
}

// ParseCached is Parse with a bounded cache keyed by the sha256 of raw:
// clients start the same workflow again and again, and every run's fold
// parses its snapshot. A parsed Workflow is immutable and safe for
// concurrent use, so one may serve every caller.
func ParseCached(raw []byte) (*Workflow, error) {
	key := sha256.Sum256(raw)
	c := &parseCache
	c.Lock()
	if el, ok := c.items[key]; ok {
		c.ll.MoveToFront(el)
		e := el.Value.(*cachedParse)
		c.Unlock()
		return e.wf, e.err
	}
	c.Unlock()
	wf, err := Parse(raw)
	if err != nil {
		if _, ok := err.(*ValidationError); !ok {
			return nil, err // not a verdict on raw: do not keep it
		}
	}
	c.Lock()
	defer c.Unlock()
	if _, ok := c.items[key]; !ok {
		c.items[key] = c.ll.PushFront(&cachedParse{key: key, wf: wf, err: err})
		if c.ll.Len() > parseCacheSize {
			old := c.ll.Back()
			c.ll.Remove(old)
			delete(c.items, old.Value.(*cachedParse).key)
		}
	}
	return wf, err
}
