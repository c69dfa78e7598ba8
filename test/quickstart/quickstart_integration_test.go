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
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

const (
	readyLine = "make run: ready for kubectl in "
	pageWant  = "hello from the make run upstream: you came through the egress proxy pod "
)

// TestQuickstartIntegration runs `sudo make run` (a whole local Crossplane:
// the control plane, a real node, a local registry with the packages built
// from this tree, Crossplane core installing them with crossplane xpkg
// install, a ClusterProviderConfig and an upstream web server), checks
// the provider and the function run as pods on the node from the pushed
// images, with the ServiceAccount token the kubelet projects, follows the
// three commands it prints as the user who ran sudo (apply
// examples/quickstart/, kubectl wait and crossplane resource trace, curl
// through the proxy URL of the connection Secret), checks the page came
// through the proxy pod, then sends SIGINT to make's process group as
// Ctrl-C in a terminal would and checks nothing make run started is left:
// no process, no mount below its folders, no network namespace,
// container, bridge or iptables rule; and that foreign look-alikes
// planted before (controlplane.PlantLookalikes) are all still there.
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
	// Other packages' node tests may hold the node for minutes each.
	lockCtx, lockCancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer lockCancel()
	unlock, err := controlplane.LockNode(lockCtx)
	if err != nil {
		t.Fatal(err)
	}
	lookalikesGone := controlplane.PlantLookalikes(t)
	unlock()

	// As sudo leaves it for make: root, and who ran it in SUDO_UID and
	// SUDO_GID (nobody, here).
	sudoEnv := append(withoutKubeconfig(os.Environ()), fmt.Sprintf("SUDO_UID=%d", sudoUser), fmt.Sprintf("SUDO_GID=%d", sudoUser))
	m := startMakeRun(t, root, sudoEnv, fmt.Sprintf("RUN_XPKG_REPO=127.0.0.1:%d/egressproxy", port))
	// Until it says it is ready and has printed the next commands (the
	// block ends with the Ctrl-C line): minutes on a cold machine (make
	// test has built the tools by then), seconds warm.
	printed := m.waitFor(t, "make run to be ready for kubectl and print the next commands", 30*time.Minute, "\nCtrl-C stops everything")
	t.Logf("FIGURE make run to ready for kubectl: %s", after(printed, readyLine))
	env, commands := nextCommands(t, printed)
	kubeconfig := match(t, env, `KUBECONFIG=(\S+)`)
	if !strings.Contains(printed, "In another shell, as nobody (who ran sudo") {
		t.Errorf("make run under sudo did not say whose shell the commands are for:\n%s", printed)
	}
	if st, err := os.Stat(kubeconfig); err != nil || st.Sys().(*syscall.Stat_t).Uid != sudoUser || st.Mode().Perm() != 0o600 { //nolint:forcetypeassert // Linux.
		t.Errorf("the kubeconfig %s: %v, %v; want it the user's who ran sudo, 0600", kubeconfig, st, err)
	}

	// The provider and the function: pods on the node, Running and Ready,
	// from the images pushed to the registry, with a token the kubelet
	// projects.
	node := match(t, printed, `node: (\S+) Ready in`)
	dataDir := match(t, printed, `data and logs in (\S+)`)
	checkPackagePods(t, kubeconfig, node, dataDir, fmt.Sprintf("127.0.0.1:%d/egressproxy/", port))

	// Everything make run started, before it is stopped: its process tree
	// (containerd's shims leave it; Leftovers covers them), its folders,
	// its network namespaces.
	procs := descendants(m.cmd.Process.Pid)
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
	// 4. The address the vendor would allow-list, in kubectl get: the
	// ClusterProviderConfig names the upstream as its echo endpoint, so
	// the EgressProxy's egressIP is the address the upstream saw of the
	// request above, Verified through the proxy.
	seen := match(t, page, `you came through the egress proxy pod (\S+) `)
	var got string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got = strings.TrimSpace(run(t, env, `kubectl get egressproxy payments -n team-payments -o jsonpath='{.status.proxy.egressIP} {.status.proxy.egressIPSource}'`))
		if got == seen+" Verified" || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if got != seen+" Verified" {
		t.Errorf("the EgressProxy's status.proxy egressIP and egressIPSource = %q; want %q, the address the upstream saw, Verified", got, seen+" Verified")
	}
	if table := run(t, env, `kubectl get egressproxy payments -n team-payments`); !strings.Contains(table, "EGRESS-IP") || !strings.Contains(table, seen) {
		t.Errorf("kubectl get egressproxy printed no EGRESS-IP column with %s:\n%s", seen, table)
	}

	// make run with KUBECONFIG at a cluster running Crossplane (this one)
	// takes the Crossplane path, and refuses a second install of packages
	// the cluster has, naming the object.
	t.Run("WithKubeconfigOfACrossplaneCluster", func(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
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

// sudoUser is who runs `sudo make run` in the test: nobody.
const sudoUser = 65534

// run runs a printed command in bash as the user who ran sudo, in their
// home folder, as their other shell would, after the printed export line;
// it returns stdout.
func run(t *testing.T, env, command string) string {
	t.Helper()
	home := t.TempDir()
	for _, d := range []string{filepath.Dir(home), home} {
		if err := os.Chmod(d, 0o755); err != nil { //nolint:gosec // to be entered by the user.
			t.Fatal(err)
		}
	}
	if err := os.Chown(home, sudoUser, sudoUser); err != nil {
		t.Fatal(err)
	}
	c := exec.Command("bash", "-c", "set -eo pipefail\n"+env+"\n"+command) //nolint:gosec // what make run printed.
	c.Dir = home
	c.Env = []string{"HOME=" + home, "PATH=/usr/local/bin:/usr/bin:/bin", "USER=nobody", "LANG=C.UTF-8"}
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: sudoUser, Gid: sudoUser}}
	var stderr strings.Builder
	c.Stderr = &stderr
	b, err := c.Output()
	if err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", command, err, b, stderr.String())
	}
	t.Logf("$ %s\n%s", command, b)
	return string(b)
}

// checkPackagePods checks, through the API, that the provider's and the
// function's pods run on the node, Running and Ready, from images of
// registry; and, for the provider, that its ServiceAccount token is the
// one the kubelet projected into the pod's volume (a token of its
// ServiceAccount bound to the pod, which the kubelet renews).
func checkPackagePods(t *testing.T, kubeconfig, node, dataDir, registry string) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, pkg := range []struct{ label, image string }{
		{"pkg.crossplane.io/provider", registry + "provider-egressproxy:"},
		{"pkg.crossplane.io/function", registry + "function-egressproxy:"},
	} {
		// make run waited for them Ready; a probe may still fail a moment
		// on a busy machine, so a pod not Ready is looked at again for a
		// while before it counts.
		var p corev1.Pod
		var pods []corev1.Pod
		ready := false
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
			pl, err := cs.CoreV1().Pods("crossplane-system").List(ctx, metav1.ListOptions{LabelSelector: pkg.label})
			if err != nil {
				t.Fatal(err)
			}
			pods = pods[:0]
			for _, q := range pl.Items {
				if q.DeletionTimestamp == nil {
					pods = append(pods, q)
				}
			}
			if len(pods) == 1 {
				p, ready = pods[0], false
				for _, c := range p.Status.Conditions {
					ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
				}
			}
			if (len(pods) == 1 && p.Status.Phase == corev1.PodRunning && ready) || time.Now().After(deadline) {
				break
			}
		}
		if len(pods) != 1 {
			t.Errorf("%d pods labelled %s; want one", len(pods), pkg.label)
			continue
		}
		if p.Spec.NodeName != node || p.Status.Phase != corev1.PodRunning || !ready {
			t.Errorf("pod %s: on node %q, phase %s, ready %v; want Running and Ready on the node %s", p.Name, p.Spec.NodeName, p.Status.Phase, ready, node)
		}
		if len(p.Status.ContainerStatuses) != 1 || !strings.HasPrefix(p.Status.ContainerStatuses[0].Image, pkg.image) || p.Status.ContainerStatuses[0].ImageID == "" {
			t.Errorf("pod %s runs %+v; want one container of an image %s... pulled from the registry", p.Name, p.Status.ContainerStatuses, pkg.image)
		}
		t.Logf("pod %s %s on node %s, image %s", p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.ContainerStatuses[0].Image)
		if pkg.label != "pkg.crossplane.io/provider" {
			continue
		}
		tokFile := filepath.Join(dataDir, "node", "kubelet", "root", "pods", string(p.UID), "volumes", "kubernetes.io~projected", "kube-api-access", "token")
		tok, err := os.ReadFile(tokFile) //nolint:gosec // the kubelet's file.
		if err != nil {
			t.Errorf("the provider pod's projected token: %v", err)
			continue
		}
		tr, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: string(tok)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := "system:serviceaccount:crossplane-system:" + p.Spec.ServiceAccountName
		if !tr.Status.Authenticated || tr.Status.User.Username != want || !slices.Contains(tr.Status.User.Extra["authentication.kubernetes.io/pod-name"], p.Name) {
			t.Errorf("the provider pod's projected token authenticates %v as %q, extra %v; want %s, bound to pod %s", tr.Status.Authenticated, tr.Status.User.Username, tr.Status.User.Extra, want, p.Name)
		}
	}
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
