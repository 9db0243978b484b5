package readmodel_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/readmodel"
)

func sp(start, end float64) readmodel.Span { return readmodel.Span{StartMs: start, EndMs: end} }

func open(start float64) readmodel.Span { return readmodel.Span{StartMs: start, Open: true} }

func TestLanes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		spans []readmodel.Span
		lanes []int
		n     int
	}{
		{"none", nil, []int{}, 0},
		{"one after another", []readmodel.Span{sp(0, 10), sp(10, 20), sp(25, 30)}, []int{0, 0, 0}, 1},
		{"fan-out then join", []readmodel.Span{sp(0, 50), sp(1, 40), sp(2, 60), sp(60, 70)},
			[]int{0, 1, 2, 0}, 3},
		{"a freed lane is reused, lowest first", []readmodel.Span{sp(0, 10), sp(0, 30), sp(0, 20), sp(15, 40), sp(25, 26)},
			[]int{0, 1, 2, 0, 2}, 3},
		{"by start, whatever the order given", []readmodel.Span{sp(20, 30), sp(0, 25)}, []int{1, 0}, 2},
		{"an open span holds its lane", []readmodel.Span{open(0), sp(5, 6), sp(7, 8)}, []int{0, 1, 1}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lanes, n := readmodel.Lanes(tc.spans)
			require.Equal(t, tc.lanes, lanes)
			require.Equal(t, tc.n, n)
		})
	}
}
