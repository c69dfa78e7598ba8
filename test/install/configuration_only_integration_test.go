package install_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes/kubelettest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	xpt "github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane/crossplanetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
)

// TestConfigurationOnlyIntegration is docs/install.md's install on a fresh
// Crossplane v2.4.0: the PodProxy grant make xpkg writes (its ImageConfig
// names the registry), an activation policy, and `crossplane xpkg install
// configuration` alone. Crossplane's dependency resolver installs the
// provider and the function under the names it derives from their
// repositories, which the Compositions call, and the provider with the
// grant's runtime config through the ImageConfig; an EgressProxy then gets
// a PodProxy on InjectedIdentity (which needs the grant) that becomes
// Ready, and its URL Secret. The MRDs state the connection Secret's keys.
func TestConfigurationOnlyIntegration(t *testing.T) {
	squid := providerenv.RequireSquid(t)
	ctx := context.Background()
	c := xpt.Start(t, xpt.Options{Namespaces: []string{proxyNS, "team-a"}})
	kube, repo := c.Kube, c.Repo
	trust := []string{"SSL_CERT_FILE=" + c.CAFile}
	kenv := []string{"KUBECONFIG=" + c.CP.KubeconfigPath}

	// make xpkg for this machine's architecture only (the pods run here).
	pkgs := filepath.Join(c.Dir, "xpkg")
	const v = "v0.2.0"
	xpt.Script(t, c.Root, []string{"VERSION=" + v, "XPKG_REPO=" + repo, "PLATFORMS=linux/" + runtime.GOARCH}, "xpkg.sh", pkgs)
	for _, n := range []string{providerName, functionName} {
		xpt.CLI(t, c.CLI, trust, "xpkg", "push", "-f", filepath.Join(pkgs, n+"-"+v+"-"+runtime.GOARCH+".xpkg"), repo+"/"+n+":"+v)
	}
	xpt.CLI(t, c.CLI, trust, "xpkg", "push", "-f", filepath.Join(pkgs, configName+"-"+v+".xpkg"), repo+"/"+configName+":"+v)

	if err := os.MkdirAll(filepath.Join(c.Dir, "squid"), 0o700); err != nil {
		t.Fatal(err)
	}
	kl, err := kubelettest.New(c.CP.Config, kubelettest.Options{Mode: kubelettest.Squid, SquidPath: squid, Dir: filepath.Join(c.Dir, "squid")})
	if err != nil {
		t.Fatal(err)
	}
	klCtx, stopKL := context.WithCancel(ctx)
	klDone := make(chan struct{})
	go func() { _ = kl.Run(klCtx); close(klDone) }()
	t.Cleanup(func() { stopKL(); <-klDone; kl.Stop() })

	// What the platform team applies before installing, as docs/install.md
	// says: the grant for PodProxies (with the ImageConfig for this
	// registry) and a policy activating only the namespaced PodProxy.
	grant, err := os.ReadFile(filepath.Join(pkgs, "podproxy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	xpt.ApplyYAML(t, kube, string(grant))
	xpt.ApplyYAML(t, kube, `
apiVersion: apiextensions.crossplane.io/v1alpha1
kind: ManagedResourceActivationPolicy
metadata:
  name: egressproxy-pods
spec:
  activate:
    - podproxies.proxy.m.egressproxy.io
`)

	t0 := time.Now()
	xpt.CLI(t, c.CLI, kenv, "xpkg", "install", "configuration", repo+"/"+configName+":"+v, configName)
	xpt.WaitCondition(t, kube, xpt.U("pkg.crossplane.io/v1", "Configuration", "", configName), "Healthy", 5*time.Minute)
	// The resolver's names: the Compositions call the function by its own.
	for kind, name := range map[string]string{"Provider": providerObj, "Function": functionObj} {
		xpt.WaitCondition(t, kube, xpt.U("pkg.crossplane.io/v1", kind, "", name), "Healthy", 5*time.Minute)
	}
	t.Logf("FIGURE crossplane xpkg install configuration to Configuration, Provider and Function Healthy: %.1fs", time.Since(t0).Seconds())
	for _, l := range []string{"ProviderList", "FunctionList"} {
		ul := &unstructured.UnstructuredList{}
		ul.SetAPIVersion("pkg.crossplane.io/v1")
		ul.SetKind(l)
		if err := kube.List(ctx, ul); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, o := range ul.Items {
			names = append(names, o.GetName())
		}
		if want := map[string]string{"ProviderList": providerObj, "FunctionList": functionObj}[l]; !slices.Equal(names, []string{want}) {
			t.Errorf("%s: %v; want only %s, the one the resolver installed", l, names, want)
		}
	}

	t.Run("ProviderRunsWithTheGrantsRuntimeConfig", func(t *testing.T) {
		// The resolver names no runtime config; the ImageConfig gives it.
		prov := xpt.U("pkg.crossplane.io/v1", "Provider", "", providerObj)
		if err := kube.Get(ctx, client.ObjectKeyFromObject(prov), prov); err != nil {
			t.Fatal(err)
		}
		rc, _, _ := unstructured.NestedString(prov.Object, "spec", "runtimeConfigRef", "name")
		r, seen := activeRevision(t, kube, "ProviderRevision", "pkg.crossplane.io/package", providerObj)
		if r == nil {
			t.Fatalf("no active ProviderRevision: %s", seen)
		}
		refs, _, _ := unstructured.NestedSlice(r.Object, "status", "appliedImageConfigRefs")
		if !strings.Contains(fmt.Sprint(refs), "name:provider-egressproxy reason:ConfigureRuntime") {
			t.Errorf("ProviderRevision %s status.appliedImageConfigRefs = %v; want the ImageConfig provider-egressproxy for ConfigureRuntime (Provider's runtimeConfigRef %q)", r.GetName(), refs, rc)
		}
		t.Logf("Provider %s: spec.runtimeConfigRef %q; revision %s applied ImageConfigs %v", providerObj, rc, r.GetName(), refs)
		l := &unstructured.UnstructuredList{}
		l.SetAPIVersion("apps/v1")
		l.SetKind("DeploymentList")
		if err := kube.List(ctx, l, client.InNamespace(crossplaneNS)); err != nil {
			t.Fatal(err)
		}
		var sas []string
		for _, d := range l.Items {
			if strings.HasPrefix(d.GetName(), providerObj) {
				sa, _, _ := unstructured.NestedString(d.Object, "spec", "template", "spec", "serviceAccountName")
				sas = append(sas, d.GetName()+": "+sa)
			}
		}
		if len(sas) != 1 || !strings.HasSuffix(sas[0], ": provider-egressproxy") {
			t.Errorf("the provider's Deployments and ServiceAccounts: %v; want one, on provider-egressproxy (the grant's binding)", sas)
		}
	})

	t.Run("MRDsStateTheConnectionKeys", func(t *testing.T) {
		for mrd, state := range map[string]string{"podproxies.proxy.m.egressproxy.io": "Active", "kvmproxies.proxy.m.egressproxy.io": "Inactive", "gcpproxies.proxy.egressproxy.io": "Inactive"} {
			o := xpt.U("apiextensions.crossplane.io/v1alpha1", "ManagedResourceDefinition", "", mrd)
			if err := kube.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
				t.Fatalf("kubectl get mrd %s: %v", mrd, err)
			}
			if got := connectionKeyNames(o); !slices.Equal(got, v1alpha1.ConnectionKeys) {
				t.Errorf("MRD %s spec.connectionDetails names %v; want %v", mrd, got, v1alpha1.ConnectionKeys)
			}
			if s, _, _ := unstructured.NestedString(o.Object, "spec", "state"); s != state {
				t.Errorf("MRD %s state %q; want %s (policy egressproxy-pods)", mrd, s, state)
			}
		}
		// An inactive kind has no CRD.
		o := xpt.U("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "kvmproxies.proxy.m.egressproxy.io")
		if err := kube.Get(ctx, client.ObjectKeyFromObject(o), o); err == nil {
			t.Error("CRD kvmproxies.proxy.m.egressproxy.io exists; want none for an inactive MRD")
		}
	})

	xpt.ApplyYAML(t, kube, localcrossplane.PodsProviderConfig(false, proxyNS, ""))
	t.Run("EgressProxyWithAPodProxyOnInjectedIdentity", func(t *testing.T) {
		claimReady(t, kube)
		// The composed PodProxy, on InjectedIdentity: Ready only with the
		// grant the ImageConfig's runtime config binds.
		l := &unstructured.UnstructuredList{}
		l.SetAPIVersion("proxy.m.egressproxy.io/v1alpha1")
		l.SetKind("PodProxyList")
		if err := kube.List(ctx, l, client.InNamespace("team-a")); err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != 1 {
			t.Fatalf("PodProxies in team-a: %d; want the EgressProxy's one", len(l.Items))
		}
		if s, m := localcrossplane.Condition(&l.Items[0], "Ready"); s != "True" {
			t.Errorf("PodProxy %s Ready %s %s", l.Items[0].GetName(), s, m)
		}
	})
}

// connectionKeyNames are the names in an MRD's spec.connectionDetails that
// have a description.
func connectionKeyNames(o *unstructured.Unstructured) []string {
	details, _, _ := unstructured.NestedSlice(o.Object, "spec", "connectionDetails")
	var out []string
	for _, d := range details {
		m, _ := d.(map[string]any)
		if desc, _ := m["description"].(string); desc != "" {
			n, _ := m["name"].(string)
			out = append(out, n)
		}
	}
	return out
}
