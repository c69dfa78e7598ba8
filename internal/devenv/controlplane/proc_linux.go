//go:build linux

package controlplane

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// sysProcAttr puts a child in its own process group (so a Ctrl-C meant for
// the parent's terminal group does not reach it; the parent stops it in
// order) and has the kernel SIGKILL it when the thread that started it dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// pdeathsigExec returns the command prefix that execs a program with a
// parent-death signal: util-linux's setpriv, used for the processes
// envtest starts itself (it sets only Setpgid on them). Empty when setpriv
// is missing or too old.
func pdeathsigExec() []string {
	p, err := exec.LookPath("setpriv")
	if err != nil {
		return nil
	}
	out, err := exec.Command(p, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--pdeathsig") {
		return nil
	}
	return []string{p, "--pdeathsig", "KILL", "--"}
}

// procStartTime returns the start time of pid (field 22 of /proc/PID/stat,
// in clock ticks since boot) and whether the process exists and is not a
// zombie. Together with the PID it names one process, even if the PID is
// reused later.
func procStartTime(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	st, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, false
	}
	return st, true
}
