package readmodel

import (
	"cmp"
	"math"
	"slices"
)

// Span is one step's time on a run's axis, in milliseconds from the run's
// creation: from StartMs to EndMs, or on to the end of the axis when Open
// (the step has not ended).
type Span struct {
	StartMs, EndMs float64
	Open           bool
}

// Lanes lays spans out in lanes, the waterfall's lane view: steps that
// ran at once go side by side, each in its own lane, and a lane holds
// steps one after another. Each span, in order of its start (ties in the
// order given), takes the lowest lane free by then: one whose last span
// ended at or before its start. It returns each span's lane (from 0), in
// the order given, and how many lanes there are: the most steps that were
// in flight at once.
func Lanes(spans []Span) ([]int, int) {
	order := make([]int, len(spans))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(spans[a].StartMs, spans[b].StartMs) })
	lanes := make([]int, len(spans))
	var free []float64 // per lane, when its last span ends
	for _, i := range order {
		s := spans[i]
		end := s.EndMs
		if s.Open {
			end = math.Inf(1)
		}
		lane := slices.IndexFunc(free, func(f float64) bool { return f <= s.StartMs })
		if lane < 0 {
			lane = len(free)
			free = append(free, 0)
		}
		free[lane] = max(end, s.StartMs)
		lanes[i] = lane
	}
	return lanes, len(free)
}
