//go:build unix

package pgcluster

import "syscall"

// procAttr runs a child as the server's user.
func (u serverUser) procAttr() *syscall.SysProcAttr {
	if !u.switched {
		return nil
	}
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)}}
}
