//go:build !unix

package pgcluster

import "os"

// inspectProcess reports whether pid is a live process. It cannot read the
// working directory.
func inspectProcess(pid int) (alive bool, cwd string) {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false, ""
	}
	_ = p.Release()
	return true, ""
}
