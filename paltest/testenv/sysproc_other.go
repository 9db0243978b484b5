//go:build !linux

package testenv

import "syscall"

// childAttr is the SysProcAttr for processes the test binary supervises.
// Only Linux can tie a child's life to its parent; elsewhere Main's cleanup
// is the only safeguard.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}
