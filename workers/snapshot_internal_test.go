package workers

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSnapshotSpacing: a journal growing an event at a time is
// snapshotted once it holds snapshotFrom events, then each time it has
// grown by snapshotInterval since the last snapshot: never further apart,
// and not at every append. A run whose snapshot a drive resumed from is
// spaced from that snapshot's head; a forgotten run is due at once.
func TestSnapshotSpacing(t *testing.T) {
	t.Parallel()
	var s snapshots
	var at []uint64
	for seq := uint64(1); seq <= 20_000; seq++ {
		if s.due("run_a", seq) {
			s.mark("run_a", seq)
			at = append(at, seq)
		}
	}
	require.Equal(t, uint64(snapshotFrom), at[0])
	for i := 1; i < len(at); i++ {
		require.Equal(t, snapshotInterval(at[i]), at[i]-at[i-1], "snapshot %d at seq %d", i, at[i])
	}
	require.Less(t, len(at), 60, "snapshots of a 20,000-event journal")
	require.Greater(t, 20_000-at[len(at)-1], uint64(0))
	require.LessOrEqual(t, 20_000-at[len(at)-1], snapshotInterval(20_000))

	// Resumed from a snapshot at 20,000: due an interval later.
	s.mark("run_b", 20_000)
	require.False(t, s.due("run_b", 20_000+snapshotInterval(21_000)-1))
	require.True(t, s.due("run_b", 20_000+snapshotInterval(22_000)))
	require.True(t, s.at("run_b", 20_000))
	// Forgotten (the run ended): due at once.
	s.mark("run_b", 0)
	require.False(t, s.at("run_b", 20_000))
	require.True(t, s.due("run_b", 20_001))
	require.False(t, s.due("run_c", snapshotFrom-1), "a short journal")

	// The runs remembered are bounded.
	for i := range snapshotRuns + 10 {
		s.mark(string(rune('a'+i%26))+string(rune(i)), 5_000)
	}
	require.LessOrEqual(t, len(s.last), snapshotRuns)
}
