//go:build linux

package controlplane

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

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
	// The machine's node lock, held from planting to the last look: no
	// other node runs meanwhile (it would count the look-alikes as its own
	// leftovers, or sweep between the crash and the next start).
	lock, err := os.OpenFile(nodeLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := flockContext(ctx, lock, os.Stderr); err != nil {
		t.Fatal(err)
	}
	l := plantLookalikes(t)
	if gone := l.check(); len(gone) > 0 {
		t.Fatalf("look-alikes not in place after planting: %v", gone)
	}

	log := &strings.Builder{}
	defer func() {
		if t.Failed() {
			t.Logf("log:\n%s", log.String())
		}
	}()
	cp, err := Start(ctx, Options{BinDir: bins, Node: &NodeOptions{BinDir: nodeBins, heldLock: lock}, Log: log})
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
	cp.Node, cp.removeDir = nil, false
	_ = cp.Stop()
	crashedDir := cp.Dir
	defer os.RemoveAll(crashedDir)
	left := Leftovers()
	t.Logf("the killed node left: %v", left)
	for _, want := range []string{"processes in the node's cgroups", "containerd shims", "shim sockets", "mounts", "bridges", "iptables rules", "cgroups"} {
		if !slices.ContainsFunc(left, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("the killed node left no %s (Leftovers %v): the sweep below proves nothing about them", want, left)
		}
	}

	// Start again: the sweep runs under the lock, before locked.
	var afterSweep []string
	var goneAtSweep []string
	locked := func() { afterSweep, goneAtSweep = Leftovers(), l.check() }
	cp2, err := Start(ctx, Options{BinDir: bins, Node: &NodeOptions{BinDir: nodeBins, locked: locked, heldLock: lock}, Log: log})
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
