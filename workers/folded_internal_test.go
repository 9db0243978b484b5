package workers

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
)

// TestFoldedCacheBounds: the cache keeps at most foldedMax states (the
// newest), hands each out once, and not after foldedTTL.
func TestFoldedCacheBounds(t *testing.T) {
	t.Parallel()
	var c foldedCache
	now := time.Now()
	for i := range 3 * foldedMax {
		c.put(fmt.Sprint("run", i), &folded{st: &engine.RunState{}, at: now})
		// Putting one run again and again does not evict the others.
		c.put("again", &folded{st: &engine.RunState{}, at: now})
	}
	require.Len(t, c.runs, foldedMax)
	require.LessOrEqual(t, len(c.order), 4*foldedMax+1)
	require.NotNil(t, c.take("again", now))
	require.Nil(t, c.take("again", now), "a state is handed out once")
	require.Nil(t, c.take("run0", now), "the oldest was evicted")
	last := fmt.Sprint("run", 3*foldedMax-1)
	require.NotNil(t, c.take(last, now))
	c.put(last, &folded{st: &engine.RunState{}, at: now})
	require.Nil(t, c.take(last, now.Add(foldedTTL+time.Second)), "too old")
}
