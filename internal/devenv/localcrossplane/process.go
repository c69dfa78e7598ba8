package localcrossplane

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is a long-lived process started here, in a process group of its
// own, its output in a file.
type Process struct {
	// Name says what it is ("crossplane core").
	Name string
	// LogPath receives its stdout and stderr.
	LogPath string

	cmd    *exec.Cmd
	exited chan struct{}
}

// StartProcess starts bin with args, the environment of this process plus
// env, its output appended to logPath. It gets SIGKILL when the thread
// that started it ends (Pdeathsig), so a killed parent leaves nothing.
func StartProcess(name, logPath string, env []string, bin string, args ...string) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) //nolint:gosec // a log file of ours.
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...) //nolint:gosec // binaries this project built.
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = f.Close(); close(p.exited) }()
	return p, nil
}

// PID is the process's ID (and its process group's).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Stop sends SIGTERM to the process group, SIGKILL after grace, and
// returns once the process has exited; whatever else is left in its group
// is killed.
func (p *Process) Stop(grace time.Duration) {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// Tail is the last n lines of the process's log.
func (p *Process) Tail(n int) string { return TailFile(p.LogPath, n) }

// TailFile is the last n lines of the file at path (a log).
func TailFile(path string, n int) string {
	b, _ := os.ReadFile(path) //nolint:gosec // a log file of ours.
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
