package install_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/localcrossplane"
	"github.com/egressproxy/provider-egressproxy/internal/ociimage"
	"github.com/egressproxy/provider-egressproxy/internal/testenv"
)

func platformArm64() ociimage.Platform { return ociimage.Platform{Architecture: "arm64"} }

// loopbackFor is a loopback address for this test binary's function
// (127.M.N.9, from the process ID; never 127.0.0.x).
func loopbackFor(pid int) (string, error) {
	return fmt.Sprintf("127.%d.%d.9", 100+pid%100, (pid/100)%250+1), nil
}

// startCrossplane runs Crossplane core v2.4.0 out of cluster with its
// package manager and RBAC manager (localcrossplane.StartCore), trusting
// the registry's CA, until the test ends.
func startCrossplane(t testing.TB, bins, kubeconfig, dir, caFile string, hosts map[string]string) {
	t.Helper()
	c, err := localcrossplane.StartCore(context.Background(), localcrossplane.CoreOptions{
		BinDir: bins, Kubeconfig: kubeconfig, Dir: dir, CAFile: caFile, Hosts: hosts,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			for _, p := range []*localcrossplane.Process{c.Core, c.RBAC} {
				t.Logf("%s: last lines of its log:\n%s", p.Name, p.Tail(60))
			}
		}
	})
}

// claimReady: an EgressProxy (class standard: a PodProxy) through the
// installed Configuration and function gets Ready and its URL Secret.
func claimReady(t *testing.T, kube client.Client) {
	ctx := context.Background()
	xr := u("platform.egressproxy.io/v1alpha1", "EgressProxy", "team-a", "payments")
	xr.Object["spec"] = map[string]any{"class": "standard", "allowedClientCIDRs": []any{"10.0.0.0/8"}}
	t0 := time.Now()
	testenv.WaitFor(t, "the EgressProxy kind to be served (the Configuration's XRD)", 2*time.Minute, func() (bool, string) {
		err := kube.Create(ctx, xr.DeepCopy())
		return err == nil, fmt.Sprint(err)
	})
	waitCondition(t, kube, xr, "Ready", 3*time.Minute)
	s := &corev1.Secret{}
	if err := kube.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "payments-proxy"}, s); err != nil {
		t.Fatalf("the EgressProxy's Secret team-a/payments-proxy: %v", err)
	}
	if url := string(s.Data["url"]); !strings.HasPrefix(url, "http://") || !strings.HasSuffix(url, ":3128") {
		t.Errorf("Secret team-a/payments-proxy url = %q; want http://<host>:3128", url)
	}
	t.Logf("EgressProxy Ready with its Secret %.1fs after creation", time.Since(t0).Seconds())
}

// activateKVM: KVMProxy is inactive (no CRD); activating it makes the CRD,
// and the provider, already running, reconciles a KVMProxy (it gets a
// Synced condition; there is no KVM host here, so not Ready).
func activateKVM(t *testing.T, kube client.Client) {
	ctx := context.Background()
	mrap := u("apiextensions.crossplane.io/v1alpha1", "ManagedResourceActivationPolicy", "", "egressproxy-kvm")
	mrap.Object["spec"] = map[string]any{"activate": []any{"kvmproxies.proxy.m.egressproxy.io"}}
	if err := kube.Create(ctx, mrap); err != nil {
		t.Fatal(err)
	}
	k := u("proxy.m.egressproxy.io/v1alpha1", "KVMProxy", "team-a", "egress-kvm")
	k.Object["spec"] = map[string]any{
		"providerConfigRef": map[string]any{"kind": "ClusterProviderConfig", "name": "home-kvm"},
		"forProvider":       map[string]any{"proxy": map[string]any{"allowedClientCIDRs": []any{"10.0.0.0/8"}}},
	}
	testenv.WaitFor(t, "KVMProxy to be served once activated", 2*time.Minute, func() (bool, string) {
		err := kube.Create(ctx, k.DeepCopy())
		return err == nil, fmt.Sprint(err)
	})
	testenv.WaitFor(t, "the provider to reconcile the KVMProxy", 2*time.Minute, func() (bool, string) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(k), k); err != nil {
			return false, err.Error()
		}
		s, m := condition(k, "Synced")
		return s != "", s + " " + m
	})
	_, m := condition(k, "Synced")
	t.Logf("activated KVMProxy reconciled: Synced %s", m)
}

// upgrade pushes v0.2.1 and moves the Provider to it: a new revision takes
// over, the proxies stay Ready, nothing is made twice.
func upgrade(t *testing.T, kube client.Client, cliBin string, trust []string, push func(string), rev func() *unstructured.Unstructured,
	r0 *unstructured.Unstructured, pp, pve *unstructured.Unstructured, repo string, vms func() int) {
	ctx := context.Background()
	deps := func() []string {
		l := &unstructured.UnstructuredList{}
		l.SetAPIVersion("apps/v1")
		l.SetKind("DeploymentList")
		_ = kube.List(ctx, l, client.InNamespace(proxyNS))
		var out []string
		for _, d := range l.Items {
			out = append(out, d.GetName()+"/"+string(d.GetUID()))
		}
		return out
	}
	before := deps()
	vmsBefore := vms()
	push("v0.2.1")
	t0 := time.Now()
	prov := u("pkg.crossplane.io/v1", "Provider", "", providerObj)
	if err := kube.Get(ctx, client.ObjectKeyFromObject(prov), prov); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(prov.Object, repo+"/"+providerName+":v0.2.1", "spec", "package")
	if err := kube.Update(ctx, prov); err != nil {
		t.Fatal(err)
	}
	var r1 *unstructured.Unstructured
	testenv.WaitFor(t, "a new revision for v0.2.1 to be active and Healthy", 5*time.Minute, func() (bool, string) {
		r1 = rev()
		img, _, _ := unstructured.NestedString(r1.Object, "spec", "image")
		return r1.GetName() != r0.GetName() && strings.HasSuffix(img, ":v0.2.1"), r1.GetName() + " " + img
	})
	t.Logf("FIGURE upgrade v0.2.0 -> v0.2.1 (update to new revision Healthy): %.1fs", time.Since(t0).Seconds())
	old := u("pkg.crossplane.io/v1", "ProviderRevision", "", r0.GetName())
	if err := kube.Get(ctx, client.ObjectKeyFromObject(old), old); err == nil {
		if st, _, _ := unstructured.NestedString(old.Object, "spec", "desiredState"); st != "Inactive" {
			t.Errorf("old revision %s desiredState %q, want Inactive", old.GetName(), st)
		}
	}
	// One Provider of the package, and the new process reconciles the
	// proxies: still Ready, same objects.
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion("pkg.crossplane.io/v1")
	l.SetKind("ProviderList")
	if err := kube.List(ctx, l); err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 {
		var names []string
		for _, p := range l.Items {
			names = append(names, p.GetName())
		}
		t.Errorf("Providers after the upgrade: %v; want one", names)
	}
	for _, o := range []*unstructured.Unstructured{pp, pve} {
		waitCondition(t, kube, o, "Ready", time.Minute)
	}
	if after := deps(); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Errorf("PodProxy Deployments before the upgrade %v, after %v: want the same objects", before, after)
	}
	if n := vms(); n != vmsBefore {
		t.Errorf("Proxmox VMs before the upgrade %d, after %d: want none made again", vmsBefore, n)
	}
}

// deleteProvider deletes the Provider while proxies exist: the provider's
// runtime goes; what happens to the CRDs, the proxy objects and their
// instances is logged (it races: see docs/install.md, Uninstall).
func deleteProvider(t *testing.T, kube client.Client) {
	ctx := context.Background()
	prov := u("pkg.crossplane.io/v1", "Provider", "", providerObj)
	if err := kube.Delete(ctx, prov); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the provider's Deployments to go", 2*time.Minute, func() (bool, string) {
		l := &unstructured.UnstructuredList{}
		l.SetAPIVersion("apps/v1")
		l.SetKind("DeploymentList")
		if err := kube.List(ctx, l, client.InNamespace(crossplaneNS), client.HasLabels{"pkg.crossplane.io/provider"}); err != nil {
			return false, err.Error()
		}
		var names []string
		for _, d := range l.Items {
			names = append(names, d.GetName())
		}
		return len(names) == 0, strings.Join(names, ",")
	})
	// Give the garbage collector a moment to act on what the revisions
	// owned, then look.
	time.Sleep(5 * time.Second)
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion("apps/v1")
	l.SetKind("DeploymentList")
	if err := kube.List(ctx, l, client.InNamespace(proxyNS)); err != nil {
		t.Fatal(err)
	}
	// What follows is a race (docs/install.md, Uninstall): logged, not
	// asserted.
	for _, crd := range []string{"podproxies.proxy.m.egressproxy.io", "proxmoxproxies.proxy.m.egressproxy.io"} {
		o := u("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", crd)
		err := kube.Get(ctx, client.ObjectKeyFromObject(o), o)
		state := "present"
		switch {
		case err != nil:
			state = err.Error()
		case o.GetDeletionTimestamp() != nil:
			state = "being deleted (held by the proxies' finalizers)"
		}
		t.Logf("after deleting the Provider: CRD %s %s", crd, state)
	}
	pp := &unstructured.UnstructuredList{}
	pp.SetAPIVersion("proxy.m.egressproxy.io/v1alpha1")
	pp.SetKind("PodProxyList")
	err := kube.List(ctx, pp)
	t.Logf("after deleting the Provider: %d PodProxies (%v), %d Squid Deployments", len(pp.Items), err, len(l.Items))
}
