package event_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
)

func delta(call uint64, index int, text string) event.Delta {
	return event.Delta{StepID: "a", Attempt: 1, Call: call, Index: index, Text: text, Kind: event.DeltaText, Reset: index == 0}
}

// TestStreamedOrdersAndResets: the one rule every watcher applies to
// deltas: in order per call, each once, a later call starting the step's
// text again, an earlier or ended call dropped.
func TestStreamedOrdersAndResets(t *testing.T) {
	t.Parallel()
	var s event.Streamed
	for _, tt := range []struct {
		d    event.Delta
		want int
		text string
	}{
		{delta(5, 0, "Hel"), event.DeltaNew, "Hel"},
		{delta(5, 1, "lo"), event.DeltaNew, "Hello"},
		{delta(5, 1, "lo"), event.DeltaSeen, "Hello"},
		{delta(5, 3, "!"), event.DeltaGap, "Hello"},
		{delta(5, 2, " wor"), event.DeltaNew, "Hello wor"},
		// The step is resumed after a crash: a later call starts again.
		{delta(9, 1, "x"), event.DeltaGap, "Hello wor"},
		{delta(9, 0, "Hi"), event.DeltaNew, "Hi"},
		{delta(5, 3, "ld"), event.DeltaStale, "Hi"},
		{event.Delta{StepID: "a", Attempt: 1, Call: 9, Index: 1, Text: "thinking", Kind: event.DeltaReasoning}, event.DeltaNew, "Hi"},
		{delta(9, 2, " there"), event.DeltaNew, "Hi there"},
	} {
		require.Equal(t, tt.want, s.Apply(tt.d), "%+v", tt.d)
		text, reasoning, _ := s.Text("a")
		require.Equal(t, tt.text, text, "%+v", tt.d)
		if tt.d.Call == 9 && tt.d.Index >= 1 && tt.want == event.DeltaNew {
			require.Equal(t, "thinking", reasoning)
		}
	}
	s.Force(delta(9, 7, "…"))
	text, _, _ := s.Text("a")
	require.Equal(t, "Hi there…", text, "forced past a hole")

	// The journal ends the call: its late deltas are stale, the text is
	// the journal's now; a later call (a retry) streams afresh.
	s.End("a", 12)
	require.Equal(t, event.DeltaStale, s.Apply(delta(9, 8, "late")))
	text, _, _ = s.Text("a")
	require.Empty(t, text)
	require.Equal(t, event.DeltaNew, s.Apply(delta(13, 0, "again")))
	text, _, attempt := s.Text("a")
	require.Equal(t, "again", text)
	require.Equal(t, 1, attempt)
	// A later call's text, seen before the end of the call it follows
	// (a retry's deltas read before the step_retrying that precedes
	// them), stays.
	var r event.Streamed
	require.Equal(t, event.DeltaNew, r.Apply(delta(20, 0, "retry")))
	r.End("a", 19)
	text, _, _ = r.Text("a")
	require.Equal(t, "retry", text)
	require.Equal(t, event.DeltaStale, r.Apply(delta(15, 0, "old")))
	require.True(t, event.Ends(event.Event{Kind: event.StepRetrying, StepID: "a"}))
	require.False(t, event.Ends(event.Event{Kind: event.StepStarted, StepID: "a"}))
}
