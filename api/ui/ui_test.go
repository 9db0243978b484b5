package ui_test

import (
	"io/fs"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api/ui"
	"github.com/palrun/pal/event"
)

// The run page follows the run's event feed, whose events are named by
// kind (event: <kind>): it must listen for every kind, or an event of one
// it leaves out redraws the page only at the next poll.
func TestRunPageListensForEveryKind(t *testing.T) {
	t.Parallel()
	src, err := fs.ReadFile(ui.Static(), "run.js")
	require.NoError(t, err)
	list := regexp.MustCompile(`(?s)const kinds = \[(.*?)\];`).FindSubmatch(src)
	require.NotNil(t, list, "run.js names the kinds it listens for")
	var got []string
	for _, m := range regexp.MustCompile(`"([a-z_]+)"`).FindAllSubmatch(list[1], -1) {
		got = append(got, string(m[1]))
	}
	var want []string
	for _, k := range event.Kinds {
		want = append(want, string(k))
	}
	slices.Sort(got)
	slices.Sort(want)
	require.Equal(t, want, got)
}
