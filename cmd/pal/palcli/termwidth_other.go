//go:build !unix

package palcli

import "os"

// ttyWidth is 0 where PAL does not ask the terminal: $COLUMNS or the
// default applies.
func ttyWidth(*os.File) int { return 0 }
