//go:build !linux

package palcli

import "syscall"

// childProcAttr: without a parent-death signal, pal dev's children are
// stopped by its own shutdown only.
func childProcAttr() *syscall.SysProcAttr { return nil }
