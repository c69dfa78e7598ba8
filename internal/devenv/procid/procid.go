// Package procid names a running process so that a record of it outlives
// neither the process nor a reuse of its pid: the project's records of
// what a process made or holds on the machine (a network namespace, a
// hold on forwarding) are judged stale by it after a kill.
package procid

import (
	"fmt"
	"os"
	"strings"
)

// Of names the process pid by its pid and start time (field 22 of
// /proc/PID/stat), which a later process reusing the pid does not share.
func Of(pid int) (string, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return "", fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 20 {
		return "", fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	return fmt.Sprintf("%d %s", pid, fields[19]), nil
}

// Self is Of(os.Getpid()).
func Self() (string, error) { return Of(os.Getpid()) }

// Running reports whether the process a record of Of names still runs.
func Running(rec string) bool {
	var pid int
	if _, err := fmt.Sscanf(rec, "%d", &pid); err != nil {
		return false
	}
	id, err := Of(pid)
	return err == nil && id == strings.TrimSpace(rec)
}
