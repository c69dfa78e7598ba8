//go:build !linux

package controlplane

import "syscall"

// sysProcAttr puts a child in its own process group. There is no
// parent-death signal outside Linux: a killed parent leaves its children.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func pdeathsigExec() []string { return nil }

// procStartTime only tells whether pid exists outside Linux.
func procStartTime(pid int) (uint64, bool) {
	return 0, syscall.Kill(pid, 0) == nil
}
