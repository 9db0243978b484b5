package pgcluster

import (
	"fmt"
	"os"
	"strings"
)

// inspectProcess reports whether pid is a live process (zombies are not)
// and, if it can be read, its working directory: a postmaster and its
// children work in the data directory.
func inspectProcess(pid int) (alive bool, cwd string) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false, ""
	}
	// "pid (comm) state ...", where comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 >= len(stat) {
		return false, ""
	}
	switch stat[i+2] {
	case 'Z', 'X', 'x':
		return false, ""
	}
	cwd, _ = os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	return true, cwd
}
