package palcli

import "syscall"

// childProcAttr makes a child of pal dev die with it (parent-death
// signal), so a killed pal dev leaves no node or worker behind.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
