package install_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	xpt "github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane/crossplanetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// caDir is where the DeploymentRuntimeConfig mounts extra CA
// certificates; SSL_CERT_DIR names it, so the provider trusts them beside
// the image's own bundle.
const caDir = "/etc/egressproxy/ca"

// trustCA puts a CA into the provider's trust as docs/install.md says for
// a private endpoint behind a CA of your own: a ConfigMap in Crossplane's
// namespace, mounted through the DeploymentRuntimeConfig
// provider-egressproxy (cluster/rbac/podproxy.yaml), SSL_CERT_DIR naming
// the folder.
func trustCA(t *testing.T, kube client.Client, caPEM []byte) {
	t.Helper()
	ctx := context.Background()
	if err := kube.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: crossplaneNS, Name: "egressproxy-ca"},
		Data: map[string]string{"gcp-endpoint.crt": string(caPEM)}}); err != nil {
		t.Fatal(err)
	}
	drc := xpt.U("pkg.crossplane.io/v1beta1", "DeploymentRuntimeConfig", "", "provider-egressproxy")
	if err := kube.Get(ctx, client.ObjectKeyFromObject(drc), drc); err != nil {
		t.Fatal(err)
	}
	drc.Object["spec"].(map[string]any)["deploymentTemplate"] = map[string]any{"spec": map[string]any{ //nolint:forcetypeassert // the DRC has a spec.
		"selector": map[string]any{},
		"template": map[string]any{"spec": map[string]any{
			"volumes": []any{map[string]any{"name": "egressproxy-ca", "configMap": map[string]any{"name": "egressproxy-ca"}}},
			"containers": []any{map[string]any{
				"name":         "package-runtime",
				"env":          []any{map[string]any{"name": "SSL_CERT_DIR", "value": caDir}},
				"volumeMounts": []any{map[string]any{"name": "egressproxy-ca", "mountPath": caDir, "readOnly": true}},
			}},
		}},
	}}
	if err := kube.Update(ctx, drc); err != nil {
		t.Fatal(err)
	}
}

// gcpReady: a GCPProxy on a ClusterProviderConfig whose gcp.endpoint is
// the Compute Engine fake (HTTPS, its CA trusted through trustCA), with a
// real service-account key: the provider signs a JWT with it, trades it at
// the key's token_uri for an access token, and the fake refuses Compute
// calls without one (RequireAuth). Ready needs the instance's address to
// answer the provider's probe on the proxy port as its Squid: the test
// answers there, as Squid on the VM would.
func gcpReady(t *testing.T, kube client.Client, fake *gcptest.Server) {
	ctx := context.Background()
	const sa = "egressproxy@" + gcpProject + ".iam.gserviceaccount.com"
	if err := kube.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gcp-key", Namespace: crossplaneNS},
		Data: map[string][]byte{"key.json": fake.ServiceAccountKey(sa)}}); err != nil {
		t.Fatal(err)
	}
	xpt.ApplyYAML(t, kube, `
apiVersion: m.egressproxy.io/v1alpha1
kind: ClusterProviderConfig
metadata:
  name: gcp-fake
spec:
  gcp:
    project: `+gcpProject+`
    endpoint: `+fake.URL+`
    credentials:
      source: Secret
      secretRef: {namespace: crossplane-system, name: gcp-key, key: key.json}
    zones: [europe-west1-b]
    images:
      ubuntu-2404: {image: "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"}
    machineTypes:
      small: {machineType: e2-small}
---
apiVersion: proxy.m.egressproxy.io/v1alpha1
kind: GCPProxy
metadata:
  name: egress-gcp
  namespace: team-a
spec:
  providerConfigRef:
    kind: ClusterProviderConfig
    name: gcp-fake
  forProvider:
    proxy:
      allowedClientCIDRs: ["10.0.0.0/8"]
`)
	g := xpt.U("proxy.m.egressproxy.io/v1alpha1", "GCPProxy", "team-a", "egress-gcp")
	var ip, identity string
	testenv.WaitFor(t, "the GCPProxy's instance in the Compute Engine fake", 3*time.Minute, func() (bool, string) {
		for _, n := range fake.Names() {
			zn, ok := strings.CutPrefix(n, "instance ")
			if !ok {
				continue
			}
			zone, name, _ := strings.Cut(zn, "/")
			in, _ := fake.Instance(zone, name)
			nics, _ := in["networkInterfaces"].([]any)
			for _, nic := range nics {
				acs, _ := nic.(map[string]any)["accessConfigs"].([]any)
				for _, ac := range acs {
					if a, _ := ac.(map[string]any)["natIP"].(string); a != "" {
						ip = a
					}
				}
			}
			md, _ := in["metadata"].(map[string]any)
			items, _ := md["items"].([]any)
			for _, it := range items {
				if m, _ := it.(map[string]any); m["key"] == "egressproxy-squid-conf" {
					v, _ := m["value"].(string)
					identity = squid.IdentityOf(v)
				}
			}
		}
		_ = kube.Get(ctx, client.ObjectKeyFromObject(g), g)
		st, m := localcrossplane.Condition(g, "Synced")
		return ip != "" && identity != "", fmt.Sprintf("fake holds %v; Synced %s %s", fake.Names(), st, m)
	})
	// Squid on the VM, as the provider's probe asks it who it is: the
	// visible_hostname of the squid.conf the provider put in the
	// instance's metadata.
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "3128"))
	if err != nil {
		t.Fatalf("listening on the instance's address %s:3128: %v", ip, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go squid.AnswerProbes(l, identity)
	xpt.WaitCondition(t, kube, g, "Ready", 3*time.Minute)
	if p := fake.Principal(fake.LastAuthorization()); p != sa {
		t.Errorf("the last Compute call carried a token of %q; want one the fake issued for the key's account %s", p, sa)
	}
	// The config's health check went to the same endpoint.
	pc := xpt.U("m.egressproxy.io/v1alpha1", "ClusterProviderConfig", "", "gcp-fake")
	xpt.WaitCondition(t, kube, pc, "Healthy", 2*time.Minute)
}

// legacyClaimReady: an EgressProxyClaim (the Crossplane v1 way the
// Configuration also ships: a claim of a cluster-scoped XEgressProxy,
// class standard, a legacy PodProxy on the legacy ProviderConfig pods)
// gets Ready and its connection Secret in the claim's namespace.
func legacyClaimReady(t *testing.T, kube client.Client) {
	ctx := context.Background()
	xpt.ApplyYAML(t, kube, localcrossplane.PodsProviderConfig(true, proxyNS, ""))
	c := xpt.U("legacy.platform.egressproxy.io/v1alpha1", "EgressProxyClaim", "team-a", "orders")
	c.Object["spec"] = map[string]any{"class": "standard", "allowedClientCIDRs": []any{"10.30.0.0/16"},
		"writeConnectionSecretToRef": map[string]any{"name": "orders-proxy"}}
	t0 := time.Now()
	xpt.CreateOnceServed(t, kube, c) // the Configuration's legacy XRD
	xpt.WaitCondition(t, kube, c, "Ready", 3*time.Minute)
	s := &corev1.Secret{}
	testenv.WaitFor(t, "the claim's Secret team-a/orders-proxy with a url", time.Minute, func() (bool, string) {
		if err := kube.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "orders-proxy"}, s); err != nil {
			return false, err.Error()
		}
		return len(s.Data["url"]) > 0, fmt.Sprintf("keys: %v", keys(s.Data))
	})
	if url := string(s.Data["url"]); !strings.HasPrefix(url, "http://") || !strings.HasSuffix(url, ":3128") {
		t.Errorf("Secret team-a/orders-proxy url = %q; want http://<host>:3128", url)
	}
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion("proxy.egressproxy.io/v1alpha1")
	l.SetKind("PodProxyList")
	if err := kube.List(ctx, l); err != nil || len(l.Items) != 1 {
		t.Errorf("legacy PodProxies for the claim: %d (%v); want 1", len(l.Items), err)
	}
	t.Logf("EgressProxyClaim Ready with its Secret %.1fs after creation", time.Since(t0).Seconds())
}

func keys(m map[string][]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// missingDependency: a Configuration whose dependsOn names a provider the
// registry does not have. What the user sees is the Configuration's
// Healthy condition: False, naming the dependency and its constraint
// (Crossplane v2.4.0: `Package revision health is "False" with message:
// cannot resolve package dependencies: missing dependencies:
// "<registry>/egressproxy/provider-does-not-exist" (>=v1.0.0)`).
func missingDependency(t *testing.T, kube client.Client, cliBin string, trust, kenv []string, repo, dir string) {
	ctx := context.Background()
	if err := os.MkdirAll(filepath.Join(dir, "examples"), 0o700); err != nil {
		t.Fatal(err)
	}
	missing := repo + "/provider-does-not-exist"
	if err := os.WriteFile(filepath.Join(dir, "crossplane.yaml"), []byte(`apiVersion: meta.pkg.crossplane.io/v1
kind: Configuration
metadata:
  name: configuration-broken
spec:
  crossplane:
    version: ">=v2.0.0-0"
  dependsOn:
    - apiVersion: pkg.crossplane.io/v1
      kind: Provider
      package: `+missing+`
      version: ">=v1.0.0"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(dir, "configuration-broken.xpkg")
	xpt.CLI(t, cliBin, nil, "xpkg", "build", "--package-root", dir, "--examples-root", filepath.Join(dir, "examples"), "-o", pkg)
	xpt.CLI(t, cliBin, trust, "xpkg", "push", "-f", pkg, repo+"/configuration-broken:v0.0.1")
	xpt.CLI(t, cliBin, kenv, "xpkg", "install", "configuration", repo+"/configuration-broken:v0.0.1", "configuration-broken")
	cfg := xpt.U("pkg.crossplane.io/v1", "Configuration", "", "configuration-broken")
	var seen string
	testenv.WaitFor(t, "the Configuration's conditions to name its missing dependency", 3*time.Minute, func() (bool, string) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(cfg), cfg); err != nil {
			return false, err.Error()
		}
		seen = localcrossplane.Conditions(cfg)
		for _, r := range revisions(t, kube, "ConfigurationRevision", "pkg.crossplane.io/package", "configuration-broken") {
			seen += " | revision " + r.GetName() + ": " + localcrossplane.Conditions(r)
		}
		st, m := localcrossplane.Condition(cfg, "Healthy")
		return st == "False" && strings.Contains(m, `missing dependencies: "`+missing+`"`), seen
	})
	t.Logf("a Configuration with a missing dependency shows: %s", seen)
	if err := kube.Delete(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}
