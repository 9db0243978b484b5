//go:build !unix

package pgcluster

import "syscall"

// procAttr runs a child as the current user: only Unix switches users.
func (u serverUser) procAttr() *syscall.SysProcAttr { return nil }
