//go:build linux

package controlplane

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/forwarding"
)

// machineState is what of this machine a node touches: iptables rules
// and chains, network namespaces, links, mounts (the lines a node's would
// be in; other tests on this machine may change the rest meanwhile), the
// kubelet's folder of log links, the kernel settings the kubelet sets and
// the forwarding the CNI bridge plugin turns on.
type machineState struct {
	iptables, netns, links, mounts, containerLogs string
	sysctls, forwarding                           map[string]string
}

var (
	counters = regexp.MustCompile(`\[\d+:\d+\]`)
	nodeLike = regexp.MustCompile(`KUBE-|CNI-|cni-|` + bridgePrefix + `|veth|/kubepods|` + nodeCgroup + `|` + regexp.QuoteMeta(filepath.Join(os.TempDir(), tempPrefix)))
)

func snapshot(t *testing.T) machineState {
	t.Helper()
	lines := func(s string) string {
		var b strings.Builder
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(l, "#") && nodeLike.MatchString(l) {
				b.WriteString(counters.ReplaceAllString(l, "") + "\n")
			}
		}
		return b.String()
	}
	out := func(name string, args ...string) string {
		b, err := exec.Command(name, args...).Output()
		if err != nil {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		return lines(string(b))
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	s := machineState{
		iptables:   out("iptables-save") + out("ip6tables-save"),
		netns:      out("ip", "netns", "list"),
		links:      out("ip", "-o", "link", "show"),
		mounts:     lines(string(mounts)),
		sysctls:    readSysctls(kernelTunables),
		forwarding: readSysctls(forwardingSysctls),
	}
	if ents, err := os.ReadDir(containerLogDir); err != nil {
		s.containerLogs = err.Error() + "\n"
	} else {
		var links strings.Builder
		for _, e := range ents {
			target, _ := os.Readlink(filepath.Join(containerLogDir, e.Name()))
			links.WriteString(e.Name() + " -> " + target + "\n")
		}
		s.containerLogs = lines(links.String())
	}
	return s
}

func readSysctls(keys []string) map[string]string {
	m := map[string]string{}
	for _, k := range keys {
		b, _ := os.ReadFile("/proc/sys/" + k)
		m[k] = strings.TrimSpace(string(b))
	}
	return m
}

// TestNodeIntegration starts a control plane with a real node, runs a pod
// on it, and stops it: the machine is as it was (iptables, network
// namespaces, links, mounts, /var/log/containers, the kubelet's kernel
// settings, forwarding), and nothing a node makes is left (Leftovers).
func TestNodeIntegration(t *testing.T) {
	RequireNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bins, nodeBins := nodeTestBins(ctx, t)
	// Under the machine's node lock: another test's node may run until
	// then.
	var before machineState
	// Another part of the project needs forwarding from before the node
	// starts (a test's libvirt NAT network, in another test binary) and
	// lets go of it while the node runs, below.
	var other *forwarding.Hold
	locked := func() {
		before = snapshot(t)
		// Held by a part of another test binary already (the KVM NAT
		// test): the machine's own value is the one the holds put back.
		_, machine, _, err := forwarding.State()
		if err != nil {
			t.Error(err)
		}
		before.forwarding["net/ipv4/ip_forward"] = machine
		if other, err = forwarding.Take("other"); err != nil {
			t.Error(err)
		}
	}
	defer func() { _ = other.Release(false) }()

	start := time.Now()
	log := &strings.Builder{}
	cp, err := Start(ctx, Options{BinDir: bins, Node: &NodeOptions{BinDir: nodeBins, locked: locked}, Log: log})
	if err != nil {
		t.Fatalf("start: %v\n%s", err, log.String())
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = cp.Stop()
		}
		if t.Failed() {
			t.Logf("log:\n%s", log.String())
		}
	}()
	t.Logf("control plane and node up in %.1fs", time.Since(start).Seconds())
	n := cp.Node
	if got := snapshot(t).sysctls; !equalMaps(got, before.sysctls) {
		t.Errorf("kernel settings with the node up %v; want them as before %v", got, before.sysctls)
	}

	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	// A pod of the sandbox image itself: pause, as a non-root user with
	// the driver's kind of securityContext.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext:              &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65535)},
			Containers: []corev1.Container{{
				Name: "pause", Image: pauseImage, ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{
					ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	eventually(t, 2*time.Minute, "pod Running", func() (bool, error) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", fmt.Errorf("phase %s, node %q, conditions %+v, containers %+v", p.Status.Phase, p.Spec.NodeName, p.Status.Conditions, p.Status.ContainerStatuses)
	})
	t.Logf("pod Running %.1fs after its creation, IP %s, node %s", time.Since(created).Seconds(), pod.Status.PodIP, pod.Spec.NodeName)
	if pod.Spec.NodeName != n.Name || !strings.HasPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://") {
		t.Errorf("pod on node %q, container %q; want %q and a containerd container", pod.Spec.NodeName, pod.Status.ContainerStatuses[0].ContainerID, n.Name)
	}
	if ip, err := netip.ParseAddr(pod.Status.PodIP); err != nil || !n.PodCIDR.Contains(ip) {
		t.Errorf("pod IP %s not in the pod network %s", pod.Status.PodIP, n.PodCIDR)
	}
	// The node says its pod network, as where node CIDRs are allocated:
	// PodProxies read it to deny it.
	if node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if node.Spec.PodCIDR != n.PodCIDR.String() || !slices.Equal(node.Spec.PodCIDRs, []string{n.PodCIDR.String()}) {
		t.Errorf("node %s: podCIDR %q, podCIDRs %v; want %s", n.Name, node.Spec.PodCIDR, node.Spec.PodCIDRs, n.PodCIDR)
	}
	// The Services' range is the one the node routes onto its bridge,
	// free on this machine.
	if svc, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err != nil || !n.serviceCIDR.Contains(ip) || n.serviceCIDR.Overlaps(n.PodCIDR) {
		t.Errorf("Service kubernetes ClusterIP %s; want it in %s, apart from the pod network %s", svc.Spec.ClusterIP, n.serviceCIDR, n.PodCIDR)
	}
	out, err := exec.Command(n.Ctr()[0], append(n.Ctr()[1:], "tasks", "list")...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")) {
		t.Errorf("ctr tasks list (%v) does not show the pod's container:\n%s", err, out)
	}
	// The API server reaches the kubelet's API (logs, exec) with the client
	// certificate from the node's own CA; the kubelet refuses anonymous
	// requests, so a certificate it does not trust fails this.
	if _, err := cs.CoreV1().Pods("default").GetLogs("p", &corev1.PodLogOptions{}).DoRaw(ctx); err != nil {
		t.Errorf("pod logs through the API server (its kubelet client certificate): %v", err)
	}

	// The other part lets go of forwarding: the node's pods keep it.
	if err := other.Release(false); err != nil {
		t.Fatal(err)
	}
	if got := readSysctls(forwardingSysctls)["net/ipv4/ip_forward"]; got != "1" {
		t.Errorf("ip_forward %s with the node up, after another part let go of it; want 1: the node's pods need it", got)
	}

	// Stopped with the pod still there: the stop removes it too. The
	// machine is looked at before another test's node may start.
	n.holdLock = true
	defer n.releaseLock()
	t0 := time.Now()
	err = cp.Stop()
	stopped = true
	if err != nil {
		t.Fatalf("stop: %v", err)
	}
	t.Logf("stopped in %.1fs", time.Since(t0).Seconds())
	if left := Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	after := snapshot(t)
	// Forwarding at one moment with whether a part of another test binary
	// still holds it: the snapshot's own read may be older than that.
	now, _, stillHeld, err := forwarding.State()
	if err != nil {
		t.Fatal(err)
	}
	after.forwarding["net/ipv4/ip_forward"] = now
	for what, pair := range map[string][2]string{
		"iptables": {before.iptables, after.iptables}, "network namespaces": {before.netns, after.netns},
		"links": {before.links, after.links}, "mounts": {before.mounts, after.mounts},
		containerLogDir: {before.containerLogs, after.containerLogs},
	} {
		if pair[0] != pair[1] {
			t.Errorf("%s differ after the node stopped:\nbefore:\n%s\nafter:\n%s", what, pair[0], pair[1])
		}
	}
	if !equalMaps(after.sysctls, before.sysctls) {
		t.Errorf("kernel settings after %v; want %v", after.sysctls, before.sysctls)
	}
	// Still held by a part of another test binary, forwarding stays on
	// for it; otherwise the machine has its own value back.
	if stillHeld {
		before.forwarding["net/ipv4/ip_forward"] = "1"
	}
	if !equalMaps(after.forwarding, before.forwarding) {
		t.Errorf("forwarding after %v; want %v", after.forwarding, before.forwarding)
	}
	if _, err := os.Stat(cp.Dir); !os.IsNotExist(err) {
		t.Errorf("control-plane folder %s still there (%v)", cp.Dir, err)
	}
}

// nodeTestBins finds (or builds) the control plane's and the node's
// binaries.
func nodeTestBins(ctx context.Context, t *testing.T) (bins, nodeBins string) {
	t.Helper()
	bins, err := BinDir(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if nodeBins, err = nodeBinDir(ctx, os.Stderr); err != nil {
		t.Fatal(err)
	}
	return bins, nodeBins
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
