//go:build linux

// Package quickstart_test is the README's quickstart, run as a new user
// would: `make run` with no KUBECONFIG, then the three commands it prints,
// then Ctrl-C.
package quickstart_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/testenv"
)

const (
	readyLine = "make run: ready for kubectl in "
	pageWant  = "hello from the make run upstream: you came through the egress proxy pod "
)

// TestQuickstartIntegration runs `make run` (a whole local Crossplane: the
// control plane, a real node, a local registry with the packages built
// from this tree, Crossplane core installing them with crossplane xpkg
// install, a ClusterProviderConfig and an upstream web server), follows
// the three commands it prints (apply examples/quickstart/, kubectl wait
// and crossplane resource trace, curl through the proxy URL of the
// connection Secret), checks the page came through the proxy pod, then
// sends SIGINT to make's process group as Ctrl-C in a terminal would and
// checks nothing make run started is left: no process, no mount below its
// folders, no network namespace, container, bridge or iptables rule.
func TestQuickstartIntegration(t *testing.T) {
	controlplane.RequireNode(t)
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// A registry port of its own, so that a developer's make run on the
	// default 127.0.0.1:5000 and this test never collide.
	port := testenv.FreePort(t)

	logPath := filepath.Join(t.TempDir(), "make-run.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	cmd := exec.Command("make", "--no-print-directory", "run", fmt.Sprintf("RUN_XPKG_REPO=127.0.0.1:%d/egressproxy", port))
	cmd.Dir = root
	cmd.Env = withoutKubeconfig(os.Environ())
	cmd.Stdout, cmd.Stderr = io.MultiWriter(pw, logFile), io.MultiWriter(pw, logFile)
	// A process group of its own, as a shell gives a foreground job: the
	// SIGINT below reaches make and everything in its group, as Ctrl-C
	// would.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); _ = pw.Close(); _ = logFile.Close() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
			select {
			case err := <-exited:
				t.Logf("make run stopped at the end of the test (%v)", err)
			case <-time.After(2 * time.Minute):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("make run printed:\n%s", b)
		}
	})

	// Until it says it is ready: minutes on a cold machine (make test has
	// built the tools by then), seconds warm.
	var out strings.Builder
	lines := make(chan string)
	go func() {
		s := bufio.NewScanner(pr)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	deadline := time.After(30 * time.Minute)
	ready := false
	for !ready {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("make run ended before it was ready (%v)", <-exited)
			}
			out.WriteString(l + "\n")
			if strings.HasPrefix(l, readyLine) {
				ready = true
			}
		case <-deadline:
			t.Fatal("make run was not ready for kubectl after 30 minutes")
		}
	}
	// The next commands follow the ready line; the block ends with the
	// Ctrl-C line.
	for l := range lines {
		out.WriteString(l + "\n")
		if strings.HasPrefix(l, "Ctrl-C stops everything") {
			break
		}
	}
	go func() { // keep draining, so make run never blocks on its output
		for range lines {
		}
	}()
	printed := out.String()
	t.Logf("FIGURE make run to ready for kubectl: %s", after(printed, readyLine))
	env, commands := nextCommands(t, printed)

	// Everything make run started, before it is stopped: its process tree
	// (containerd's shims leave it; Leftovers covers them), its folders,
	// its network namespaces.
	procs := descendants(cmd.Process.Pid)
	dataDir := match(t, printed, `data and logs in (\S+)`)
	netnses := []string{match(t, printed, `\(namespace (epx[0-9a-f]+)\)`), match(t, printed, `network namespace (epx[0-9a-f]+)\)`)}
	t.Logf("make run runs %d processes; data in %s; network namespaces %v", len(procs), dataDir, netnses)

	// 1. Apply the quickstart.
	t0 := time.Now()
	run(t, env, commands[0])
	// 2. Wait for it and trace it.
	trace := run(t, env, commands[1])
	t.Logf("FIGURE quickstart apply to EgressProxy Ready (kubectl wait returned): %.1fs", time.Since(t0).Seconds())
	for _, want := range []string{"EgressProxy/payments (team-payments)", "PodProxy/payments (team-payments)", "Secret/payments-proxy (team-payments)"} {
		if !strings.Contains(trace, want) {
			t.Errorf("crossplane resource trace printed no %q:\n%s", want, trace)
		}
	}
	// 3. The page, through the proxy.
	page := run(t, env, commands[2])
	if !strings.HasPrefix(page, pageWant) {
		t.Errorf("curl through the proxy printed %q; want the upstream's page, reached through the proxy pod (%q...)", page, pageWant)
	}

	// make run with KUBECONFIG at a cluster running Crossplane (this one)
	// takes the Crossplane path, and refuses a second install of packages
	// the cluster has, naming the object.
	t.Run("WithKubeconfigOfACrossplaneCluster", func(t *testing.T) {
		kubeconfig := match(t, env, `KUBECONFIG=(\S+)`)
		c := exec.Command("make", "--no-print-directory", "run", fmt.Sprintf("XPKG_REPO=127.0.0.1:%d/egressproxy", port))
		c.Dir = root
		c.Env = append(withoutKubeconfig(os.Environ()), "KUBECONFIG="+kubeconfig)
		b, err := c.CombinedOutput()
		for _, want := range []string{"runs Crossplane", "provider.pkg.crossplane.io/egressproxy-provider-egressproxy is installed in this cluster already"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("KUBECONFIG=%s make run printed no %q (exit %v):\n%s", kubeconfig, want, err, b)
			}
		}
		if err == nil {
			t.Errorf("KUBECONFIG=%s make run succeeded; want it refused:\n%s", kubeconfig, b)
		}
	})

	// Ctrl-C.
	stopped = true
	tStop := time.Now()
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		// make reports the interrupt as an error; what matters is what is
		// left.
		t.Logf("make run stopped in %.1fs (%v)", time.Since(tStop).Seconds(), err)
	case <-time.After(2 * time.Minute):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal("make run had not stopped 2 minutes after SIGINT")
	}

	var left []string
	for pid, p := range procs {
		if alive(pid, p.start) {
			left = append(left, fmt.Sprintf("process %d (%s)", pid, p.cmd))
		}
	}
	if mounts := mountsBelow(dataDir); len(mounts) > 0 {
		left = append(left, fmt.Sprintf("mounts %v", mounts))
	}
	if _, err := os.Stat(dataDir); err == nil {
		left = append(left, "its folder "+dataDir)
	}
	for _, ns := range netnses {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			left = append(left, "network namespace "+ns)
		}
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		_ = c.Close()
		left = append(left, fmt.Sprintf("the registry on 127.0.0.1:%d", port))
	}
	// The node's containers, network namespaces, bridge, iptables rules
	// and cgroups, looked for while no other node can run.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	release, err := controlplane.LockNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	left = append(left, controlplane.Leftovers()...)
	release()
	if len(left) > 0 {
		t.Errorf("after Ctrl-C, make run left behind:\n  %s", strings.Join(left, "\n  "))
	}
}

// nextCommands finds the export line and the three commands make run
// printed after its ready line.
func nextCommands(t *testing.T, printed string) (string, []string) {
	t.Helper()
	var env string
	var cmds []string
	ls := strings.Split(printed[strings.Index(printed, readyLine):], "\n")
	for i, l := range ls {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "export ") {
			env = l
		}
		if regexp.MustCompile(`^# [123]\. `).MatchString(l) && i+1 < len(ls) {
			cmds = append(cmds, strings.TrimSpace(ls[i+1]))
		}
	}
	if env == "" || len(cmds) != 3 {
		t.Fatalf("make run printed no export line and three commands after %q:\n%s", readyLine, printed)
	}
	return env, cmds
}

// run runs a printed command in bash from another folder, as a user's
// other shell would, after the printed export line; it returns stdout.
func run(t *testing.T, env, command string) string {
	t.Helper()
	c := exec.Command("bash", "-c", "set -eo pipefail\n"+env+"\n"+command) //nolint:gosec // what make run printed.
	c.Dir = t.TempDir()
	c.Env = withoutKubeconfig(os.Environ())
	var stderr strings.Builder
	c.Stderr = &stderr
	b, err := c.Output()
	if err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", command, err, b, stderr.String())
	}
	t.Logf("$ %s\n%s", command, b)
	return string(b)
}

func withoutKubeconfig(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "KUBECONFIG=") {
			out = append(out, kv)
		}
	}
	return out
}

func after(s, prefix string) string {
	i := strings.Index(s, prefix)
	rest := s[i+len(prefix):]
	if j := strings.IndexByte(rest, '\n'); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

func match(t *testing.T, s, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("make run printed nothing matching %s:\n%s", re, s)
	}
	return m[1]
}

type procInfo struct {
	start string // /proc/PID/stat field 22: tells a reused PID apart
	cmd   string
}

// descendants are the processes below pid, by their parent links.
func descendants(pid int) map[int]procInfo {
	parent := map[int]int{}
	info := map[int]procInfo{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, start, ok := stat(p)
		if !ok {
			continue
		}
		parent[p] = ppid
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		info[p] = procInfo{start: start, cmd: strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))}
	}
	out := map[int]procInfo{}
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out[p] = info[p]
				break
			}
		}
	}
	out[pid] = info[pid]
	return out
}

// stat is a process's parent and start time, from /proc/PID/stat.
func stat(pid int) (int, string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" {
		return 0, "", false
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid, f[19], true
}

func alive(pid int, start string) bool {
	_, s, ok := stat(pid)
	return ok && s == start
}

// mountsBelow lists the mount points below dir.
func mountsBelow(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}
