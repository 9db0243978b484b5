package palcli

import (
	"os"
	"strconv"
)

// defaultWidth is the waterfall's width when nothing says otherwise.
const defaultWidth = 100

// termWidth is the width of the terminal stdout writes to, else $COLUMNS,
// else defaultWidth.
func (e *env) termWidth() int {
	if f, ok := e.stdout.(*os.File); ok {
		if n := ttyWidth(f); n > 0 {
			return n
		}
	}
	if n, err := strconv.Atoi(e.getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	return defaultWidth
}
