//go:build unix && !linux

package pgcluster

import (
	"errors"
	"syscall"
)

// inspectProcess reports whether pid is a live process. Without /proc it
// cannot tell a zombie from a live process, nor read the working directory.
func inspectProcess(pid int) (alive bool, cwd string) {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM), ""
}
