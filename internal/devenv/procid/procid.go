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

// StartTime is the start time of pid (field 22 of /proc/PID/stat, in
// clock ticks since boot), which a later process reusing the pid does not
// share; false when there is no such process, or only its zombie, which
// runs nothing.
func StartTime(pid int) (string, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return "", false
	}
	return f[19], true
}

// Of names the running process pid by its pid and start time.
func Of(pid int) (string, error) {
	st, ok := StartTime(pid)
	if !ok {
		return "", fmt.Errorf("no running process %d", pid)
	}
	return fmt.Sprintf("%d %s", pid, st), nil
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
