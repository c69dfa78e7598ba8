package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

const (
	// EnvBinDir names the environment variable that, when set, names the
	// folder holding etcd, kube-apiserver and kube-controller-manager, and
	// replaces running hack/controlplane-bins.sh.
	EnvBinDir = "EGRESSPROXY_CONTROLPLANE_BIN"

	modulePath = "github.com/egressproxy/provider-egressproxy"
	binsScript = "hack/controlplane-bins.sh"
)

// BinDir returns the folder holding the control-plane binaries: the value of
// EGRESSPROXY_CONTROLPLANE_BIN if set, otherwise the folder printed by
// hack/controlplane-bins.sh, which builds the binaries from the Go module
// proxy only when they are missing (about 6 minutes cold, instant when
// cached). The script's progress goes to log (may be nil).
func BinDir(ctx context.Context, log io.Writer) (string, error) {
	if d := os.Getenv(EnvBinDir); d != "" {
		return d, nil
	}
	return runBinsScript(ctx, log, binsScript)
}

// runBinsScript runs one of the hack/*-bins.sh scripts and returns the
// folder it prints last.
func runBinsScript(ctx context.Context, log io.Writer, script string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	var stdout bytes.Buffer
	tail := &tailBuffer{max: 4096}
	var stderr io.Writer = tail
	if log != nil {
		stderr = io.MultiWriter(log, tail)
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, script))
	cmd.Dir = root
	cmd.Stdout = &stdout
	cmd.Stderr = stderr
	// Own process group, so cancelling kills the go builds it runs too; the
	// parent-death signal only reaches bash itself.
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s failed: %w; last output:\n%s", script, err, tail.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if dir == "" {
		return "", fmt.Errorf("%s printed no folder; last output:\n%s", script, tail.String())
	}
	return dir, nil
}

// RepoRoot finds the root of this repository: from this source file's
// location when the build kept it, otherwise by walking up from the working
// directory to the go.mod of this module.
func RepoRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
		if isRepoRoot(root) {
			return root, nil
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if isRepoRoot(d) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	return "", fmt.Errorf("cannot find the %s repository (with %s) above %s; set %s to a folder holding etcd, kube-apiserver and kube-controller-manager",
		modulePath, binsScript, wd, EnvBinDir)
}

func isRepoRoot(d string) bool {
	mod, err := os.ReadFile(filepath.Join(d, "go.mod"))
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(mod), "\n")
	if strings.TrimSpace(first) != "module "+modulePath {
		return false
	}
	_, err = os.Stat(filepath.Join(d, binsScript))
	return err == nil
}

func checkBinaries(dir string, names ...string) error {
	var missing []string
	for _, n := range names {
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("control-plane binaries missing from %s: %s (run %s, or point %s at a folder holding them)",
			dir, strings.Join(missing, ", "), binsScript, EnvBinDir)
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }

func killGroup(pid int) error {
	err := syscall.Kill(-pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}
