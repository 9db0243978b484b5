package workers

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Two drives of one run in one worker (the first's lease ran out before
// it noticed): the first one's end leaves the second registered, and a
// cancel notice reaches every drive still there.
func TestCancelReachesEachDriveOfARun(t *testing.T) {
	t.Parallel()
	w := &Worker{active: map[string]map[*context.CancelCauseFunc]struct{}{}}
	first, cancelFirst := context.WithCancelCause(t.Context())
	second, cancelSecond := context.WithCancelCause(t.Context())
	third, cancelThird := context.WithCancelCause(t.Context())
	untrackFirst := w.track("run_a", cancelFirst)
	untrackSecond := w.track("run_a", cancelSecond)
	untrackThird := w.track("run_a", cancelThird)

	untrackFirst()
	w.cancelDrives("run_a", errRunEnded)
	require.NoError(t, first.Err(), "the drive that ended is not cancelled again")
	require.ErrorIs(t, context.Cause(second), errRunEnded)
	require.ErrorIs(t, context.Cause(third), errRunEnded)

	untrackSecond()
	untrackThird()
	require.Empty(t, w.active, "nothing left once every drive ended")
}
