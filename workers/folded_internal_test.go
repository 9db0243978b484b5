package workers

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
)

// TestFoldedCacheBounds: the cache keeps at most foldedMax states (the
// newest), hands each out once, and frees one whose time is up.
func TestFoldedCacheBounds(t *testing.T) {
	t.Parallel()
	c := newFoldedCache(foldedMax, foldedTTL)
	for i := range 3 * foldedMax {
		c.put(fmt.Sprint("run", i), &folded{st: &engine.RunState{}})
		// Putting one run again and again does not evict the others.
		c.put("again", &folded{st: &engine.RunState{}})
	}
	require.Equal(t, foldedMax, c.lru.Len())
	require.NotNil(t, c.take("again"))
	require.Nil(t, c.take("again"), "a state is handed out once")
	require.Nil(t, c.take("run0"), "the oldest was evicted")
	last := fmt.Sprint("run", 3*foldedMax-1)
	require.NotNil(t, c.take(last))

	short := newFoldedCache(foldedMax, 50*time.Millisecond)
	short.put("run", &folded{st: &engine.RunState{}})
	require.Eventually(t, func() bool { return short.lru.Len() == 0 }, 5*time.Second, 10*time.Millisecond,
		"a state whose time is up is freed, not only refused")
	require.Nil(t, short.take("run"))
}
