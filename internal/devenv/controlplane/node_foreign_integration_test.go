//go:build linux

package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// lookalikes are what another Kubernetes, Docker or Squid on a developer's
// machine keeps where a careless node would look: a process in a
// kubepods cgroup, kubelet and CNI chains with rules jumping to them, an
// idle cni-* network namespace, a containerd on its default socket and a
// squid. The test plants them and removes what it planted.
type lookalikes struct {
	cgroupProc    *exec.Cmd
	cgroupDir     string
	chains        [][3]string // iptables, table, chain
	jumps         [][]string  // iptables -C arguments
	netns         string
	socket        string
	listener      net.Listener
	services      []*exec.Cmd
	cleanups      []func()
	cgroupCreated []string
}

func plantLookalikes(t *testing.T) *lookalikes {
	t.Helper()
	l := &lookalikes{}
	t.Cleanup(l.remove)
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	suffix := hex.EncodeToString(id)

	// A pod of another kubelet: cgroup v2's kubepods.slice, or v1's
	// /kubepods in the pids hierarchy (any one the node would sweep).
	var dir string
	if fileExists(filepath.Join(cgroupFS, "cgroup.controllers")) {
		dir = filepath.Join(cgroupFS, "kubepods.slice", "kubepods-besteffort.slice", "kubepods-besteffort-podlookalike"+suffix+".slice")
	} else {
		h := filepath.Join(cgroupFS, "pids")
		if !fileExists(filepath.Join(h, "cgroup.procs")) {
			ents, _ := os.ReadDir(cgroupFS)
			for _, e := range ents {
				if p := filepath.Join(cgroupFS, e.Name()); fileExists(filepath.Join(p, "cgroup.procs")) {
					h = p
					break
				}
			}
		}
		dir = filepath.Join(h, "kubepods", "besteffort", "podlookalike"+suffix)
	}
	for p := dir; p != cgroupFS && !fileExists(p); p = filepath.Dir(p) {
		l.cgroupCreated = append(l.cgroupCreated, p)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("planting a foreign kubepods cgroup: %v", err)
	}
	l.cgroupDir = dir
	l.cgroupProc = startSleep(t, "sleep")
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(l.cgroupProc.Process.Pid)), 0o644); err != nil {
		t.Fatalf("moving a sleep into %s: %v", dir, err)
	}

	// Another kubelet's firewall chain and a CNI firewall plugin's chain,
	// each with a rule jumping to it (empty chains: they return at once).
	for _, c := range [][2]string{{kubeletChains[0], "INPUT"}, {"CNI-FORWARD", "FORWARD"}} {
		chain, from := c[0], c[1]
		if !slices.Contains(chainsOf(iptablesSave("iptables", "filter")), chain) {
			if out, err := exec.Command("iptables", "-t", "filter", "-N", chain).CombinedOutput(); err != nil {
				t.Fatalf("iptables -N %s: %v: %s", chain, err, out)
			}
			l.cleanups = append(l.cleanups, func() { _ = exec.Command("iptables", "-t", "filter", "-X", chain).Run() })
		}
		jump := []string{"-t", "filter", from, "-j", chain}
		if exec.Command("iptables", append([]string{"-C"}, jump...)...).Run() != nil {
			if out, err := exec.Command("iptables", append([]string{"-A"}, jump...)...).CombinedOutput(); err != nil {
				t.Fatalf("iptables -A %v: %v: %s", jump, err, out)
			}
			// Before the chain's -X, registered above.
			l.cleanups = append(l.cleanups, func() { _ = exec.Command("iptables", append([]string{"-D"}, jump...)...).Run() })
		}
		l.chains = append(l.chains, [3]string{"iptables", "filter", chain})
		l.jumps = append(l.jumps, jump)
	}

	// Another containerd's idle pod network namespace.
	l.netns = "cni-" + suffix + "-0000-4000-8000-lookalike0000"
	if out, err := exec.Command("ip", "netns", "add", l.netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", l.netns, err, out)
	}
	l.cleanups = append(l.cleanups, func() { _ = exec.Command("ip", "netns", "delete", l.netns).Run() })

	// Docker's containerd on its default socket, unless a real one is
	// there (then that one must survive), and a system squid.
	l.socket = "/run/containerd/containerd.sock"
	if _, err := os.Stat(l.socket); errors.Is(err, os.ErrNotExist) {
		if !fileExists(filepath.Dir(l.socket)) {
			if err := os.Mkdir(filepath.Dir(l.socket), 0o711); err != nil {
				t.Fatal(err)
			}
			l.cleanups = append(l.cleanups, func() { _ = os.Remove(filepath.Dir(l.socket)) })
		}
		ln, err := net.Listen("unix", l.socket)
		if err != nil {
			t.Fatalf("standing in for a containerd on %s: %v", l.socket, err)
		}
		l.listener = ln
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.Close()
			}
		}()
		l.services = append(l.services, startSleep(t, "containerd"))
	}
	l.services = append(l.services, startSleep(t, "containerd-shim-runc-v2"), startSleep(t, "squid"))
	return l
}

// startSleep starts a sleep whose command line names it argv0: a process
// standing in for another's.
func startSleep(t *testing.T, argv0 string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	cmd.Args[0] = argv0
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	return cmd
}

// check reports the look-alikes that are gone or changed.
func (l *lookalikes) check() []string {
	var gone []string
	alive := func(what string, cmd *exec.Cmd) {
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			gone = append(gone, fmt.Sprintf("%s (pid %d): %v", what, cmd.Process.Pid, err))
		}
	}
	alive("the process in the foreign cgroup "+l.cgroupDir, l.cgroupProc)
	if b, err := os.ReadFile(filepath.Join(l.cgroupDir, "cgroup.procs")); err != nil || !slices.Contains(strings.Fields(string(b)), strconv.Itoa(l.cgroupProc.Process.Pid)) {
		gone = append(gone, fmt.Sprintf("cgroup %s or the sleep in it (%v)", l.cgroupDir, err))
	}
	for _, c := range l.chains {
		if !slices.Contains(chainsOf(iptablesSave(c[0], c[1])), c[2]) {
			gone = append(gone, fmt.Sprintf("%s chain %s/%s", c[0], c[1], c[2]))
		}
	}
	for _, j := range l.jumps {
		if out, err := exec.Command("iptables", append([]string{"-C"}, j...)...).CombinedOutput(); err != nil {
			gone = append(gone, fmt.Sprintf("iptables rule %v: %s", j, strings.TrimSpace(string(out))))
		}
	}
	if !fileExists("/run/netns/" + l.netns) {
		gone = append(gone, "network namespace "+l.netns)
	}
	if c, err := net.DialTimeout("unix", l.socket, time.Second); err != nil && l.listener != nil {
		gone = append(gone, fmt.Sprintf("the containerd socket %s: %v", l.socket, err))
	} else if err == nil {
		_ = c.Close()
	}
	for _, s := range l.services {
		alive(s.Args[0], s)
	}
	return gone
}

func (l *lookalikes) remove() {
	for _, s := range append(l.services, l.cgroupProc) {
		if s != nil {
			_ = s.Process.Kill()
		}
	}
	if l.listener != nil {
		_ = l.listener.Close() // removes the socket
	}
	if l.cgroupProc != nil {
		waitGone([]int{l.cgroupProc.Process.Pid}, 5*time.Second)
	}
	for _, d := range l.cgroupCreated {
		_ = syscall.Rmdir(d)
	}
	for i := len(l.cleanups) - 1; i >= 0; i-- {
		l.cleanups[i]()
	}
}

// runPausePod runs a pod of the sandbox image on the node and waits until
// it is Running.
func runPausePod(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "pause", Image: pauseImage, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "pod "+name+" Running", func() (bool, error) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s, conditions %+v", p.Status.Phase, p.Status.Conditions)
	})
	return pod
}

// TestNodeLeavesForeignLookalikesIntegration plants what another
// Kubernetes, Docker and Squid keep on a developer's machine, then starts
// a node with a pod, kills it without a clean stop, starts one again
// (whose start-up sweep removes what the killed one left) and stops it:
// every look-alike survives all of it, while the killed node's own
// processes, mounts, bridge, chains and cgroups are gone.
func TestNodeLeavesForeignLookalikesIntegration(t *testing.T) {
	RequireNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bins, nodeBins := nodeTestBins(ctx, t)
	// Planted under the node lock: another test's node may run until then
	// (and it must not count them as its own leftovers).
	release, err := LockNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := plantLookalikes(t)
	release()
	if gone := l.check(); len(gone) > 0 {
		t.Fatalf("look-alikes not in place after planting: %v", gone)
	}

	log := &strings.Builder{}
	defer func() {
		if t.Failed() {
			t.Logf("log:\n%s", log.String())
		}
	}()
	cp, err := Start(ctx, Options{BinDir: bins, Node: &NodeOptions{BinDir: nodeBins}, Log: log})
	if err != nil {
		t.Fatalf("start: %v\n%s", err, log.String())
	}
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	runPausePod(ctx, t, cs, "crashed")
	if gone := l.check(); len(gone) > 0 {
		t.Errorf("look-alikes gone with the node up: %v", gone)
	}

	// A crash: the node's processes killed, nothing of its stop run; the
	// control plane's folder (with the node's) stays as a killed make run
	// leaves it.
	n := cp.Node
	for _, p := range n.procs {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	n.releaseLock()
	cp.Node, cp.removeDir = nil, false
	_ = cp.Stop()
	crashedDir := cp.Dir
	defer os.RemoveAll(crashedDir)
	left := Leftovers()
	t.Logf("the killed node left: %v", left)
	for _, want := range []string{"processes in the node's cgroups", "containerd shims", "mounts", "bridges", "iptables rules", "cgroups"} {
		if !slices.ContainsFunc(left, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("the killed node left no %s (Leftovers %v): the sweep below proves nothing about them", want, left)
		}
	}

	// Start again: the sweep runs under the lock, before locked.
	var afterSweep []string
	var goneAtSweep []string
	locked := func() { afterSweep, goneAtSweep = Leftovers(), l.check() }
	cp2, err := Start(ctx, Options{BinDir: bins, Node: &NodeOptions{BinDir: nodeBins, locked: locked}, Log: log})
	if err != nil {
		t.Fatalf("start after the crash: %v", err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = cp2.Stop()
		}
	}()
	if len(afterSweep) > 0 {
		t.Errorf("the start-up sweep left the killed node's %v", afterSweep)
	}
	if len(goneAtSweep) > 0 {
		t.Errorf("look-alikes gone after the start-up sweep: %v", goneAtSweep)
	}
	if cs, err = kubernetes.NewForConfig(cp2.Config); err != nil {
		t.Fatal(err)
	}
	runPausePod(ctx, t, cs, "second")

	cp2.Node.holdLock = true
	defer cp2.Node.releaseLock()
	err = cp2.Stop()
	stopped = true
	if err != nil {
		t.Errorf("stop: %v", err)
	}
	if left := Leftovers(); len(left) > 0 {
		t.Errorf("left behind after a clean stop: %v", left)
	}
	if gone := l.check(); len(gone) > 0 {
		t.Errorf("look-alikes gone after the node's start, crash, start-up sweep and stop: %v", gone)
	}
}
