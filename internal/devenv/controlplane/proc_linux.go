//go:build linux

package controlplane

import (
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/procid"
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

// procStartTime returns the start time of pid (procid.StartTime, as a
// number) and whether the process exists and is not a zombie. Together
// with the PID it names one process, even if the PID is reused later.
func procStartTime(pid int) (uint64, bool) {
	s, ok := procid.StartTime(pid)
	if !ok {
		return 0, false
	}
	st, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false
	}
	return st, true
}
