package workers

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
)

// TestStartLooksSpanStartLag: the deliveries of a start's work that may
// find no journal wait, between them, eventstore.StartLag in all, and one
// fewer would wait less: the deliveries bound the looks, and StartLag
// says how long they take.
func TestStartLooksSpanStartLag(t *testing.T) {
	t.Parallel()
	var waited time.Duration
	for n := 1; n < int(startLooks)-1; n++ {
		waited += startRedelivery.Wait(n)
	}
	require.Less(t, waited, eventstore.StartLag)
	waited += startRedelivery.Wait(int(startLooks) - 1)
	require.GreaterOrEqual(t, waited, eventstore.StartLag)
	require.Equal(t, uint64(36), startLooks, "docs/architecture.md §8 and §11.3 say 36")
	ms := time.Millisecond
	require.Equal(t, []time.Duration{20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second},
		[]time.Duration{startRedelivery.Wait(1), startRedelivery.Wait(2), startRedelivery.Wait(3), startRedelivery.Wait(4),
			startRedelivery.Wait(5), startRedelivery.Wait(6), startRedelivery.Wait(7), startRedelivery.Wait(36)})
	require.Equal(t, []time.Duration{200 * time.Microsecond, 600 * time.Microsecond, 1800 * time.Microsecond},
		[]time.Duration{startLook.Wait(1), startLook.Wait(2), startLook.Wait(3)}, "readStart's looks")
}
