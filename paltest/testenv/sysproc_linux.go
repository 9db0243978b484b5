package testenv

import "syscall"

// childAttr is the SysProcAttr for processes the test binary supervises: if
// the test binary dies (a -timeout panic, a kill), the kernel kills them
// too, so no PAL process or broker outlives the test run.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
