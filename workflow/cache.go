package workflow

import (
	"crypto/sha256"

	lru "github.com/hashicorp/golang-lru/v2"
)

// parseCacheSize bounds the workflows ParseCached keeps.
const parseCacheSize = 512

// parseCache holds ParseCached's verdicts by the sha256 of the bytes. The
// lru.Cache locks for itself.
var parseCache, _ = lru.New[[32]byte, cachedParse](parseCacheSize) // fails only for a size below 1

type cachedParse struct {
	wf  *Workflow
	err error
}

// ParseCached is Parse with a bounded cache keyed by the sha256 of raw:
// clients start the same workflow again and again, and every run's fold
// parses its snapshot. A parsed Workflow is immutable and safe for
// concurrent use, so one may serve every caller.
func ParseCached(raw []byte) (*Workflow, error) {
	key := sha256.Sum256(raw)
	if e, ok := parseCache.Get(key); ok {
		return e.wf, e.err
	}
	wf, err := Parse(raw)
	if err != nil {
		if _, ok := err.(*ValidationError); !ok {
			return nil, err // not a verdict on raw: do not keep it
		}
	}
	// Two callers may parse the same bytes at once; the first verdict
	// kept is the one every later caller gets.
	parseCache.ContainsOrAdd(key, cachedParse{wf: wf, err: err})
	return wf, err
}
