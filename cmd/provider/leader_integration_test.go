package main_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// leaseName is the provider's leader-election lease (main.go).
const leaseName = "provider-egressproxy.egressproxy.io"

// replica is one provider process.
type replica struct {
	name string
	cmd  *exec.Cmd
	out  *testenv.Buffer
}

// TestLeaderElectionIntegration runs two provider processes with leader
// election on, as two replicas of the provider's Deployment would, against
// one control plane and one (fake) Proxmox VE cluster. The leader is
// killed (SIGKILL: no lease release) in the middle of creating proxies;
// the other takes over when the lease expires and finishes them, and no
// VM is created twice.
func TestLeaderElectionIntegration(t *testing.T) {
	root, bin := buildProvider(t)
	fake := pvetest.New(t, pvetest.Options{Listen: true})
	cp, s := testenv.Start(t, controlplane.Options{CRDDirectories: []string{filepath.Join(root, "package", "crds")}})
	kube, err := client.New(cp.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "crossplane-system"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		fake.Secret("crossplane-system", "pve"),
		&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-pve"},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: fake.ProviderConfig("crossplane-system", "pve")}}},
	} {
		if err := kube.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	start := func(name string) *replica {
		r := &replica{name: name, out: &testenv.Buffer{}}
		r.cmd = exec.Command(bin, "--leader-election", "--namespace", "crossplane-system", "--installation-id", "leader-it",
			"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--poll-not-ready", "1s", "--poll", "5s",
			"--orphan-sweep-interval", "0")
		r.cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.KubeconfigPath, "GCE_METADATA_HOST=127.0.0.1:9")
		r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = r.cmd.Process.Kill()
			_ = r.cmd.Wait()
			if t.Failed() {
				t.Logf("%s output (tail):\n%s", name, tail(r.out.String(), 40))
			}
		})
		return r
	}
	holder := func() string {
		l := &coordinationv1.Lease{}
		if err := kube.Get(ctx, client.ObjectKey{Namespace: "crossplane-system", Name: leaseName}, l); err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}

	a := start("replica-a")
	testenv.WaitFor(t, "replica a to take the lease", 60*time.Second, func() (bool, string) {
		h := holder()
		return h != "", "holder " + h
	})
	first := holder()
	b := start("replica-b")
	// b is up and waiting: it must not act while a leads.
	testenv.WaitFor(t, "replica b to try for the lease", 30*time.Second, func() (bool, string) {
		return strings.Contains(strings.ToLower(b.out.String()), "attempting to acquire leader lease"), tail(b.out.String(), 3)
	})

	const n = 4
	for i := range n {
		p := &nsproxy.ProxmoxProxy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "team-a"},
			Spec: nsproxy.ProxmoxProxySpec{
				ManagedResourceSpec: xpv2.ManagedResourceSpec{ProviderConfigReference: &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "home-pve"}},
				ForProvider: spec.ProxmoxProxyParameters{Node: "pve1", MachineType: "small", Image: "debian-12",
					Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.20.0.0/16"}, Auth: &spec.ProxyAuth{Enabled: true}}},
			},
		}
		if err := kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// Kill the leader once it has started cloning, before every proxy is
	// Ready: creates are in flight.
	testenv.WaitFor(t, "the leader to start creating VMs", 60*time.Second, func() (bool, string) {
		return len(proxyVMs(fake)) > 0, fmt.Sprintf("%d VMs", len(proxyVMs(fake)))
	})
	if ready := readyCount(t, kube); ready == n {
		t.Logf("all %d proxies were Ready before the leader was killed; the takeover is still checked", n)
	}
	leader, other := a, b
	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = leader.cmd.Wait()

	// The lease runs out (60 s) and the other replica takes it.
	testenv.WaitFor(t, "replica b to take over the lease", 120*time.Second, func() (bool, string) {
		h := holder()
		return h != "" && h != first, "holder " + h
	})
	t.Logf("replica b took the lease %v after the leader was killed", time.Since(killed).Round(time.Second))
	testenv.WaitFor(t, "every proxy Ready under the new leader", 120*time.Second, func() (bool, string) {
		r := readyCount(t, kube)
		return r == n, fmt.Sprintf("%d of %d Ready; %s", r, n, tail(other.out.String(), 2))
	})
	names := map[string]int{}
	for _, v := range proxyVMs(fake) {
		names[v.Name]++
	}
	if len(names) != n {
		t.Errorf("the fake holds VMs %v, want one for each of the %d proxies", names, n)
	}
	for name, c := range names {
		if c != 1 {
			t.Errorf("VM %s was created %d times", name, c)
		}
	}
}

// proxyVMs are the fake's VMs other than its templates.
func proxyVMs(fake *pvetest.Server) []pvetest.VM {
	var out []pvetest.VM
	for _, v := range fake.VMs() {
		if v.VMID >= 100000 {
			out = append(out, v)
		}
	}
	return out
}

func readyCount(t *testing.T, kube client.Client) int {
	t.Helper()
	l := &nsproxy.ProxmoxProxyList{}
	if err := kube.List(context.Background(), l, client.InNamespace("team-a")); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range l.Items {
		if p.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
			n++
		}
	}
	return n
}
