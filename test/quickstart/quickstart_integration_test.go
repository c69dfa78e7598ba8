//go:build linux

// Package quickstart_test is the README's quickstart, run as a new user
// would: `make run` with no KUBECONFIG, then the three commands it prints,
// then Ctrl-C.
package quickstart_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
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
// folders, no network namespace, container, bridge or iptables rule; and
// that foreign look-alikes planted before (controlplane.PlantLookalikes)
// are all still there.
func TestQuickstartIntegration(t *testing.T) {
	controlplane.RequireNode(t)
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// A registry port of its own, so that a developer's make run on the
	// default 127.0.0.1:5000 and this test never collide.
	port := testenv.FreePort(t)
	// What another Kubernetes, Docker and Squid keep on a developer's
	// machine, planted while no node runs: make run and its Ctrl-C leave
	// it as it is.
	lockCtx, lockCancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer lockCancel()
	unlock, err := controlplane.LockNode(lockCtx)
	if err != nil {
		t.Fatal(err)
	}
	lookalikesGone := controlplane.PlantLookalikes(t)
	unlock()

	m := startMakeRun(t, root, withoutKubeconfig(os.Environ()), fmt.Sprintf("RUN_XPKG_REPO=127.0.0.1:%d/egressproxy", port))
	// Until it says it is ready and has printed the next commands (the
	// block ends with the Ctrl-C line): minutes on a cold machine (make
	// test has built the tools by then), seconds warm.
	printed := m.waitFor(t, "make run to be ready for kubectl and print the next commands", 30*time.Minute, "\nCtrl-C stops everything")
	t.Logf("FIGURE make run to ready for kubectl: %s", after(printed, readyLine))
	env, commands := nextCommands(t, printed)

	// Everything make run started, before it is stopped: its process tree
	// (containerd's shims leave it; Leftovers covers them), its folders,
	// its network namespaces.
	procs := descendants(m.cmd.Process.Pid)
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
	m.interrupt(t)

	left := stillRunning(procs)
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
	if gone := lookalikesGone(); len(gone) > 0 {
		t.Errorf("make run and its Ctrl-C removed or changed what is not theirs: %v", gone)
	}
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

// makeRun is `make run` started as a shell starts a foreground job: in a
// process group of its own, so that a SIGINT to the group reaches make
// and everything in it, as Ctrl-C in a terminal would.
type makeRun struct {
	cmd     *exec.Cmd
	out     testenv.Buffer // stdout and stderr, as printed
	done    chan struct{}  // closed when make has exited
	err     error          // make's exit, once done
	stopped bool
}

// startMakeRun runs `make run ARGS` in root with env; what it prints is
// logged when the test fails, and it gets SIGINT (SIGKILL 2 minutes
// later) when the test ends before interrupt.
func startMakeRun(t *testing.T, root string, env []string, args ...string) *makeRun {
	t.Helper()
	m := &makeRun{done: make(chan struct{})}
	m.cmd = exec.Command("make", append([]string{"--no-print-directory", "run"}, args...)...)
	m.cmd.Dir = root
	m.cmd.Env = env
	m.cmd.Stdout, m.cmd.Stderr = &m.out, &m.out
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { m.err = m.cmd.Wait(); close(m.done) }()
	t.Cleanup(func() {
		if !m.stopped {
			_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGINT)
			select {
			case <-m.done:
				t.Logf("make run stopped at the end of the test (%v)", m.err)
			case <-time.After(2 * time.Minute):
				_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			t.Logf("make run printed:\n%s", m.out.String())
		}
	})
	return m
}

// waitFor waits until make run has printed want and returns all it
// printed; it fails the test when make ends first or timeout passes.
func (m *makeRun) waitFor(t *testing.T, what string, timeout time.Duration, want string) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if out := m.out.String(); strings.Contains(out, want) {
			return out
		}
		select {
		case <-m.done:
			if out := m.out.String(); strings.Contains(out, want) {
				return out
			}
			t.Fatalf("make run ended (%v) before %s", m.err, what)
		case <-deadline:
			t.Fatalf("make run did not get to %s in %v", what, timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// interrupt sends SIGINT to make's process group and waits for make to
// exit (make reports the interrupt as an error; what matters is what is
// left).
func (m *makeRun) interrupt(t *testing.T) {
	t.Helper()
	m.stopped = true
	t0 := time.Now()
	if err := syscall.Kill(-m.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.done:
		t.Logf("make run stopped in %.1fs (%v)", time.Since(t0).Seconds(), m.err)
	case <-time.After(2 * time.Minute):
		_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal("make run had not stopped 2 minutes after SIGINT")
	}
}

// stillRunning lists the processes of procs that still run.
func stillRunning(procs map[int]procInfo) []string {
	var left []string
	for pid, p := range procs {
		if alive(pid, p.start) {
			left = append(left, fmt.Sprintf("process %d (%s)", pid, p.cmd))
		}
	}
	return left
}
