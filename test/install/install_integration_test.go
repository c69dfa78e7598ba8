// Package install_test installs the project the way Crossplane users do:
// the three packages built by make xpkg (the Crossplane CLI's `xpkg
// build`), pushed with `crossplane xpkg push` to an OCI registry on
// loopback with TLS from a CA the test makes, installed with `crossplane
// xpkg install` into Crossplane core v2.4.0 (package manager and RBAC
// manager) on a real control plane, and run under exactly the identity
// Crossplane gives the provider (see runtimePods). It then checks what a
// user would: the revisions Healthy, only the activated kinds present,
// PodProxy under Crossplane's RBAC without and with the shipped grant
// (a ProxmoxProxy against its fake Ready before the grant), a GCPProxy
// against the Compute Engine fake through gcp.endpoint, an EgressProxy and
// a legacy EgressProxyClaim through the installed Configuration, a
// Configuration whose dependency is missing, the release artefacts of
// v0.3.0 and the upgrade from v0.2.0 to it, and the Provider's deletion
// with proxies present.
// TestProviderPodIntegration runs the installed provider as a real pod.
package install_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes/kubelettest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	xpt "github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane/crossplanetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
)

// The names the packages install as (crossplanetest).
const (
	crossplaneNS = xpt.Namespace
	providerName = xpt.ProviderPackage
	providerObj  = xpt.ProviderObject
	functionName = xpt.FunctionPackage
	functionObj  = xpt.FunctionObject
	configName   = xpt.ConfigurationPackage
	proxyNS      = "egress-proxies"
	gcpProject   = "egressproxy-install"
)

// revisions lists the revisions of a package: name, state, image.
func revisions(t testing.TB, kube client.Client, kind, label, pkg string) []*unstructured.Unstructured {
	t.Helper()
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion("pkg.crossplane.io/v1")
	l.SetKind(kind + "List")
	if err := kube.List(context.Background(), l, client.MatchingLabels{label: pkg}); err != nil {
		t.Fatal(err)
	}
	out := make([]*unstructured.Unstructured, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, &l.Items[i])
	}
	return out
}

func activeRevision(t testing.TB, kube client.Client, kind, label, pkg string) (*unstructured.Unstructured, string) {
	var seen []string
	for _, r := range revisions(t, kube, kind, label, pkg) {
		st, _, _ := unstructured.NestedString(r.Object, "spec", "desiredState")
		img, _, _ := unstructured.NestedString(r.Object, "spec", "image")
		h, m := localcrossplane.Condition(r, "RevisionHealthy")
		rh, rm := localcrossplane.Condition(r, "RuntimeHealthy")
		seen = append(seen, fmt.Sprintf("%s %s %s RevisionHealthy=%s %s RuntimeHealthy=%s %s", r.GetName(), st, img, h, m, rh, rm))
		if st == "Active" {
			return r, strings.Join(seen, "; ")
		}
	}
	return nil, strings.Join(seen, "; ")
}

// TestInstallIntegration is the install path of docs/install.md, end to
// end.
func TestInstallIntegration(t *testing.T) {
	squid := providerenv.RequireSquid(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// The registry, the control plane (with the controllers that make
	// Deployments' pods), Crossplane core trusting the registry, and the
	// runtime for the packages' pods; then the Squid pods.
	c := xpt.Start(t, xpt.Options{Namespaces: []string{proxyNS, "team-a"}})
	root, dir, reg, repo, cliBin, kube, pods := c.Root, c.Dir, c.Registry, c.Repo, c.CLI, c.Kube, c.Pods
	trust := []string{"SSL_CERT_FILE=" + c.CAFile}

	// make xpkg of v0.2.0, and make release of v0.3.0, the upgrade.
	pkgs := filepath.Join(dir, "xpkg")
	t0 := time.Now()
	xpt.Script(t, root, []string{"VERSION=v0.2.0", "XPKG_REPO=" + repo}, "xpkg.sh", pkgs)
	// The Squid image's packages are what the mirror serves today, which
	// need not be what packages.lock records (a release insists).
	xpt.Script(t, root, []string{"VERSION=v0.3.0", "XPKG_REPO=" + repo, "ALLOW_DIRTY=1", "SQUID_IMAGE_STRICT=0"}, "release.sh", pkgs)
	t.Logf("make xpkg of v0.2.0 and make release of v0.3.0: %.1fs", time.Since(t0).Seconds())
	t.Run("ReleaseArtefacts", func(t *testing.T) {
		releaseArtefacts(t, root, pkgs, "v0.3.0", repo)
	})
	// The Squid image first, as make xpkg-push does: the provider names it
	// by digest as its default image.
	var squidRef string
	push := func(v string) {
		var err error
		if squidRef, err = reg.Client.PushLayout(ctx, filepath.Join(pkgs, "squid-egressproxy-"+v+".oci.tar"), repo+"/squid-egressproxy:"+v); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{providerName, functionName} {
			files := filepath.Join(pkgs, n+"-"+v+"-amd64.xpkg") + "," + filepath.Join(pkgs, n+"-"+v+"-arm64.xpkg")
			xpt.CLI(t, cliBin, trust, "xpkg", "push", "-f", files, repo+"/"+n+":"+v)
		}
		xpt.CLI(t, cliBin, trust, "xpkg", "push", "-f", filepath.Join(pkgs, configName+"-"+v+".xpkg"), repo+"/"+configName+":"+v)
	}
	tPush := time.Now()
	push("v0.2.0")
	t.Logf("crossplane xpkg push of the three v0.2.0 packages: %.1fs", time.Since(tPush).Seconds())
	for _, n := range []string{providerName, functionName} {
		idx, err := reg.Client.Pull(ctx, repo+"/"+n+":v0.2.0", ociimageArm64)
		if err != nil {
			t.Fatalf("the pushed %s is no multi-arch index with linux/arm64: %v", n, err)
		}
		if cf, _ := idx.ConfigFile(); cf.Config.User != "65532:65532" {
			t.Errorf("%s linux/arm64 runs as %q, want 65532:65532 (nonroot)", n, cf.Config.User)
		}
	}

	if err := os.MkdirAll(filepath.Join(dir, "squid"), 0o700); err != nil {
		t.Fatal(err)
	}
	kl, err := kubelettest.New(c.CP.Config, kubelettest.Options{Mode: kubelettest.Squid, SquidPath: squid, Dir: filepath.Join(dir, "squid")})
	if err != nil {
		t.Fatal(err)
	}
	klCtx, stopKL := context.WithCancel(ctx)
	klDone := make(chan struct{})
	go func() { _ = kl.Run(klCtx); close(klDone) }()
	t.Cleanup(func() { stopKL(); <-klDone; kl.Stop() })

	// Safe start: only PodProxy, ProxmoxProxy and GCPProxy (namespaced)
	// and the legacy PodProxy (for claims) are activated; KVMProxy stays
	// inactive.
	xpt.ApplyYAML(t, kube, `
apiVersion: apiextensions.crossplane.io/v1alpha1
kind: ManagedResourceActivationPolicy
metadata:
  name: egressproxy-some
spec:
  activate:
    - podproxies.proxy.m.egressproxy.io
    - proxmoxproxies.proxy.m.egressproxy.io
    - gcpproxies.proxy.m.egressproxy.io
    - podproxies.proxy.egressproxy.io
`)

	// crossplane xpkg install, as the README says: provider, function,
	// Configuration. The provider first without the PodProxy grant.
	kenv := []string{"KUBECONFIG=" + c.CP.KubeconfigPath}
	tInstall := time.Now()
	xpt.CLI(t, cliBin, kenv, "xpkg", "install", "provider", repo+"/"+providerName+":v0.2.0", providerObj)
	rev := func() *unstructured.Unstructured {
		var r *unstructured.Unstructured
		testenv.WaitFor(t, "the provider's active revision to be Healthy", 5*time.Minute, func() (bool, string) {
			var seen string
			r, seen = activeRevision(t, kube, "ProviderRevision", "pkg.crossplane.io/package", providerObj)
			if r == nil {
				return false, seen + " | pods: " + strings.Join(pods.Running(), "; ")
			}
			h, _ := localcrossplane.Condition(r, "RevisionHealthy")
			rh, _ := localcrossplane.Condition(r, "RuntimeHealthy")
			return h == "True" && rh == "True", seen + " | pods: " + strings.Join(pods.Running(), "; ")
		})
		return r
	}
	r0 := rev()
	t.Logf("FIGURE push to ProviderRevision Healthy: %.1fs (install to Healthy %.1fs)", time.Since(tPush).Seconds(), time.Since(tInstall).Seconds())

	t.Run("WhatCrossplaneMade", func(t *testing.T) {
		// The ServiceAccount and the Deployment of the revision, and the
		// RBAC manager's ClusterRoles: nothing is hand-made.
		sa, _, _ := unstructured.NestedString(r0.Object, "status", "serviceAccountName")
		if sa == "" {
			l := &corev1.ServiceAccountList{}
			_ = kube.List(ctx, l, client.InNamespace(crossplaneNS))
			for _, x := range l.Items {
				if strings.HasPrefix(x.Name, providerObj) {
					sa = x.Name
				}
			}
		}
		if sa == "" {
			t.Fatal("no ServiceAccount of the provider in crossplane-system")
		}
		// The RBAC manager renders them on its own schedule, which can end
		// after the revision turned Healthy.
		want := "crossplane:provider:" + r0.GetName() + ":system"
		testenv.WaitFor(t, "the RBAC manager's ClusterRole "+want, 60*time.Second, func() (bool, string) {
			crs := &unstructured.UnstructuredList{}
			crs.SetAPIVersion("rbac.authorization.k8s.io/v1")
			crs.SetKind("ClusterRoleList")
			if err := kube.List(ctx, crs); err != nil {
				return false, err.Error()
			}
			var names []string
			for _, c := range crs.Items {
				if strings.Contains(c.GetName(), r0.GetName()) {
					names = append(names, c.GetName())
				}
			}
			sort.Strings(names)
			return slices.Contains(names, want), fmt.Sprintf("ClusterRoles of the revision: %v", names)
		})
		// Inactive kinds have no CRD.
		for crd, want := range map[string]bool{
			"podproxies.proxy.m.egressproxy.io":     true,
			"proxmoxproxies.proxy.m.egressproxy.io": true,
			"gcpproxies.proxy.m.egressproxy.io":     true,
			"kvmproxies.proxy.m.egressproxy.io":     false,
			"gcpproxies.proxy.egressproxy.io":       false,
		} {
			o := xpt.U("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", crd)
			err := kube.Get(ctx, client.ObjectKeyFromObject(o), o)
			if got := err == nil; got != want {
				t.Errorf("CRD %s present = %v, want %v (activation policy egressproxy-some): %v", crd, got, want, err)
			}
		}
		if l := pods.Logs(providerObj); strings.Contains(l, "Failed to watch") {
			t.Errorf("the provider's cache failed to watch something under Crossplane's RBAC:\n%s", l)
		}
	})

	// A PodProxy on InjectedIdentity without the grant: the provider runs,
	// the PodProxy says what is missing and how to fix it.
	xpt.ApplyYAML(t, kube, localcrossplane.PodsProviderConfig(false, proxyNS, "")+`---
apiVersion: proxy.m.egressproxy.io/v1alpha1
kind: PodProxy
metadata:
  name: egress
  namespace: team-a
spec:
  providerConfigRef:
    kind: ClusterProviderConfig
    name: pods
  forProvider:
    proxy:
      allowedClientCIDRs: ["10.0.0.0/8"]
`)
	pp := xpt.U("proxy.m.egressproxy.io/v1alpha1", "PodProxy", "team-a", "egress")
	testenv.WaitFor(t, "the PodProxy to say which permission is missing", 2*time.Minute, func() (bool, string) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(pp), pp); err != nil {
			return false, err.Error()
		}
		s, m := localcrossplane.Condition(pp, "Synced")
		return s == "False" && strings.Contains(m, "may not list pods") && strings.Contains(m, "provider-egressproxy-podproxy"), s + " " + m
	})
	_, m := localcrossplane.Condition(pp, "Synced")
	t.Logf("without the grant, the PodProxy says: %s", m)

	// Every other kind works before the grant: a ProxmoxProxy against the
	// fake Proxmox VE becomes Ready while the PodProxy still says what it
	// misses.
	pve, fake := xpt.ProxmoxProxy(t, kube, "team-a")
	xpt.WaitCondition(t, kube, pve, "Ready", 3*time.Minute)
	if err := kube.Get(ctx, client.ObjectKeyFromObject(pp), pp); err != nil {
		t.Fatal(err)
	}
	if st, msg := localcrossplane.Condition(pp, "Synced"); st != "False" || !strings.Contains(msg, "may not list pods") {
		t.Errorf("with the ProxmoxProxy Ready and no grant yet, the PodProxy is Synced %s %q; want False naming the missing permission", st, msg)
	}
	if st, _ := localcrossplane.Condition(pp, "Ready"); st == "True" {
		t.Error("the PodProxy is Ready without the grant")
	}

	// The documented grant: ClusterRole, DeploymentRuntimeConfig,
	// ClusterRoleBinding, and the Provider naming the runtime config.
	b, err := os.ReadFile(filepath.Join(root, "cluster", "rbac", "podproxy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	tGrant := time.Now()
	xpt.ApplyYAML(t, kube, string(b))
	// The GCP fake's CA, trusted the way docs/install.md says for a
	// private endpoint behind a CA of your own: a ConfigMap mounted by the
	// DeploymentRuntimeConfig, SSL_CERT_DIR naming its folder.
	gfake := gcptest.NewTLS(t, gcpProject)
	gfake.AutoComplete(300 * time.Millisecond)
	gfake.RequireAuth()
	trustCA(t, kube, gfake.CAPEM)
	prov := xpt.U("pkg.crossplane.io/v1", "Provider", "", providerObj)
	// Crossplane writes the Provider's status meanwhile.
	if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(prov), prov); err != nil {
			return err
		}
		_ = unstructured.SetNestedField(prov.Object, "provider-egressproxy", "spec", "runtimeConfigRef", "name")
		return kube.Update(ctx, prov)
	}); err != nil {
		t.Fatal(err)
	}
	xpt.WaitCondition(t, kube, pp, "Ready", 3*time.Minute)
	// Its config names no image: its pod runs the provider's default, the
	// Squid image pushed next to the packages, by digest.
	if imgs := deploymentImages(ctx, t, kube, proxyNS); len(imgs) == 0 || slices.ContainsFunc(imgs, func(i string) bool { return i != squidRef }) {
		t.Errorf("the PodProxy's Deployment runs %v; want the pushed Squid image %s", imgs, squidRef)
	}
	t.Logf("FIGURE install to first PodProxy Ready: %.1fs (including the wait without the grant; grant to PodProxy Ready %.1fs)",
		time.Since(tInstall).Seconds(), time.Since(tGrant).Seconds())

	// GCPProxy against the Compute Engine fake, through gcp.endpoint, with
	// a real service-account key: the provider gets its token from the
	// key's token_uri and every Compute call carries it.
	t.Run("GCPProxyThroughTheEndpoint", func(t *testing.T) {
		gcpReady(t, kube, gfake)
	})

	// Function and Configuration; an EgressProxy gets its URL Secret.
	xpt.CLI(t, cliBin, kenv, "xpkg", "install", "function", repo+"/"+functionName+":v0.2.0", functionObj)
	xpt.CLI(t, cliBin, kenv, "xpkg", "install", "configuration", repo+"/"+configName+":v0.2.0", configName)
	xpt.WaitCondition(t, kube, xpt.U("pkg.crossplane.io/v1", "Configuration", "", configName), "Healthy", 5*time.Minute)
	xpt.WaitCondition(t, kube, xpt.U("pkg.crossplane.io/v1", "Function", "", functionObj), "Healthy", 5*time.Minute)
	t.Run("EgressProxyThroughTheConfiguration", func(t *testing.T) {
		claimReady(t, kube)
	})
	t.Run("LegacyEgressProxyClaim", func(t *testing.T) {
		legacyClaimReady(t, kube)
	})
	t.Run("ConfigurationWithAMissingDependency", func(t *testing.T) {
		missingDependency(t, kube, cliBin, trust, kenv, repo, filepath.Join(dir, "broken"))
	})

	t.Run("Activation", func(t *testing.T) {
		activateKVM(t, kube)
	})

	// Upgrade: the release v0.3.0 over v0.2.0.
	t.Run("Upgrade", func(t *testing.T) {
		upgrade(t, kube, cliBin, trust, push, rev, r0, pp, pve, repo, func() int { return len(fake.VMs()) })
	})

	// Under Crossplane's RBAC, with and without the grant, the provider
	// never stopped on its own.
	if n := pods.Exited(providerObj); n != 0 {
		t.Errorf("the provider's process exited %d times on its own; want never (a missing permission must not stop it)", n)
	}

	t.Run("DeleteProviderWithProxies", func(t *testing.T) {
		gcpInstances := func() int {
			n := 0
			for _, x := range gfake.Names() {
				if strings.HasPrefix(x, "instance ") {
					n++
				}
			}
			return n
		}
		proxies := proxiesOf(t, kube, map[string][]string{
			// Not the KVMProxy of Activation: its ClusterProviderConfig does
			// not exist, so no provider can ever finish deleting it.
			"proxy.m.egressproxy.io/v1alpha1": {"PodProxy", "ProxmoxProxy", "GCPProxy"},
			"proxy.egressproxy.io/v1alpha1":   {"PodProxy"},
		}, func(kind string, o *unstructured.Unstructured) func() int {
			switch kind {
			case "PodProxy":
				uid := string(o.GetUID())
				return func() int {
					l := &unstructured.UnstructuredList{}
					l.SetAPIVersion("apps/v1")
					l.SetKind("DeploymentList")
					_ = kube.List(ctx, l, client.InNamespace(proxyNS), client.MatchingLabels{"egressproxy.io/uid": uid})
					return len(l.Items)
				}
			case "ProxmoxProxy":
				return func() int {
					n := 0
					for _, vm := range fake.VMs() {
						if !vm.Template() {
							n++
						}
					}
					return n
				}
			case "GCPProxy":
				return gcpInstances
			}
			return func() int { return 0 }
		})
		deleteProvider(t, kube, pods.Running, proxies)
		reinstalled(t, kube, proxies)
	})
}

// ociimageArm64 is the platform the index must hold besides this machine's.
var ociimageArm64 = platformArm64()

// deploymentImages are the container images of the Deployments in ns.
func deploymentImages(ctx context.Context, t *testing.T, kube client.Client, ns string) []string {
	t.Helper()
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion("apps/v1")
	l.SetKind("DeploymentList")
	if err := kube.List(ctx, l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range l.Items {
		cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			if m, ok := c.(map[string]any); ok {
				img, _ := m["image"].(string)
				out = append(out, img)
			}
		}
	}
	return out
}
