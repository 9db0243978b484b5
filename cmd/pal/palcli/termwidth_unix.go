//go:build unix

package palcli

import (
	"os"

	"golang.org/x/sys/unix"
)

// ttyWidth is f's terminal width in columns, 0 when f is no terminal.
func ttyWidth(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Col)
}
