// Package compositions_test is the end-to-end test of the compositions in
// package/configuration: real Crossplane core v2.4.0 out of cluster on the
// local control plane, the composition function in this process over
// mTLS, the provider's controllers in this process, and the kubelet
// stand-in running a real Squid for every proxy pod.
package compositions_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	xpt "github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane/crossplanetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
)

const proxyNS = "egress-proxies"

var (
	gvkXR      = schema.GroupVersionKind{Group: "platform.egressproxy.io", Version: "v1alpha1", Kind: "EgressProxy"}
	gvkClaim   = schema.GroupVersionKind{Group: "legacy.platform.egressproxy.io", Version: "v1alpha1", Kind: "EgressProxyClaim"}
	gvkLegacy  = schema.GroupVersionKind{Group: "legacy.platform.egressproxy.io", Version: "v1alpha1", Kind: "XEgressProxy"}
	gvkPodNS   = schema.GroupVersionKind{Group: "proxy.m.egressproxy.io", Version: "v1alpha1", Kind: "PodProxy"}
	gvkPodClus = schema.GroupVersionKind{Group: "proxy.egressproxy.io", Version: "v1alpha1", Kind: "PodProxy"}
)

// env is everything running for the test.
type env struct {
	*providerenv.Env
	upstream string // http://<a test host's address>:<port>/
	port     int64
}

func start(t testing.TB) *env {
	t.Helper()
	squid := providerenv.RequireSquid(t)
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins := xpt.Script(t, root, nil, "crossplane-bins.sh")
	dir := t.TempDir()
	t0 := time.Now()
	// The provider's controllers, every kind, as cmd/provider sets them up.
	pe := providerenv.Start(t, providerenv.Options{
		// Crossplane's CRDs are installed (and established) with the
		// provider's: `core init` applies them again, but its client's REST
		// mapper may otherwise not know them yet when it writes the Lock.
		ControlPlane:   controlplane.Options{CRDDirectories: []string{filepath.Join(bins, "crds")}},
		InstallationID: "compositions", NotReadyPollInterval: 30 * time.Second,
		Namespaces: []string{proxyNS, "team-a", "team-b", "team-c"},
		// The connection Secrets come through Crossplane and the function.
		Timeout: 60 * time.Second,
	})
	cp, kube, ctx := pe.ControlPlane, pe.Kube, pe.Ctx

	xp := startCrossplane(t, kube, bins, cp.KubeconfigPath, dir)
	xp.serveFunction(t, kube, "egressproxy-function-egressproxy") // the Compositions' functionRef
	t.Logf("Crossplane core and the function up %.1fs after the start", time.Since(t0).Seconds())

	// The platform team's side: the Configuration's XRDs and Compositions,
	// and the ProviderConfigs the standard class names.
	cfg := filepath.Join(root, "package", "configuration")
	for _, f := range []string{"xrd-namespaced.yaml", "xrd-legacy.yaml", "composition-namespaced.yaml", "composition-legacy.yaml"} {
		b, err := os.ReadFile(filepath.Join(cfg, f))
		if err != nil {
			t.Fatal(err)
		}
		xpt.ApplyYAML(t, kube, string(b))
	}
	testenv.WaitFor(t, "the XRDs to be established and offered", 60*time.Second, func() (bool, string) {
		var seen []string
		ok := true
		for _, n := range []string{"egressproxies.platform.egressproxy.io", "xegressproxies.legacy.platform.egressproxy.io"} {
			x := &unstructured.Unstructured{}
			x.SetAPIVersion("apiextensions.crossplane.io/v1")
			x.SetKind("CompositeResourceDefinition")
			if err := kube.Get(ctx, types.NamespacedName{Name: n}, x); err != nil {
				return false, err.Error()
			}
			for _, c := range []string{"Established", "Offered"} {
				if n == "egressproxies.platform.egressproxy.io" && c == "Offered" {
					continue // no claims in the namespaced style
				}
				st, _ := localcrossplane.Condition(x, c)
				seen = append(seen, n+" "+c+"="+st)
				ok = ok && st == "True"
			}
		}
		return ok, strings.Join(seen, ", ")
	})
	// kube-controller-manager (garbage collector, namespace, Deployment and
	// ReplicaSet controllers) once the composite resources' CRDs exist:
	// the garbage collector watches the kinds it knows at start and finds
	// new ones only on a 30 s rediscovery, and it must see a composite's
	// deletion to cascade it to the composed resources.
	if err := cp.StartControllerManager(context.Background()); err != nil {
		t.Fatal(err)
	}

	block := &spec.KubernetesConfig{Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}, Namespace: proxyNS}
	for _, o := range []client.Object{
		&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: block}}},
		&clusterv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
			Spec: clusterv1alpha1.ProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: block}}},
	} {
		pe.Create(t, o)
	}

	// Squid's files, kept until the end for its logs. Not under
	// t.TempDir(), whose 0700 folders Squid's unprivileged user (reading
	// htpasswd) cannot enter.
	kdir, err := os.MkdirTemp("", "compositions-kubelet-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(kdir) })
	pe.StartKubelet(t, squid, kdir)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(kdir, "*", "squid.log"))
			for _, l := range logs {
				t.Logf("%s:\n%s", l, localcrossplane.TailFile(l, 30))
			}
		}
	})
	e := &env{Env: pe}
	var port int
	e.upstream, port = testenv.Upstream(t)
	e.port = int64(port)
	t.Logf("everything up %.1fs after the start", time.Since(t0).Seconds())
	return e
}

// TestCompositionsIntegration: an application team's namespaced
// EgressProxy and another team's EgressProxyClaim each get a PodProxy that
// becomes Ready, and a Secret in their namespace whose URL proxies a real
// request through a real Squid; a change to the claim rolls through to the
// proxy; deleting the claim or the composite removes everything.
func TestCompositionsIntegration(t *testing.T) {
	e := start(t)

	// kubectl expands a category before it looks for a kind: with the CRDs
	// Crossplane made of the XRDs, `kubectl get egressproxy` must be the
	// XR, and `kubectl get egressproxy-all` every kind of the provider and the XRs.
	t.Run("KubectlNames", func(t *testing.T) {
		dc, err := discovery.NewDiscoveryClientForConfig(e.ControlPlane.Config)
		if err != nil {
			t.Fatal(err)
		}
		exp := restmapper.NewDiscoveryCategoryExpander(dc)
		if got, ok := exp.Expand("egressproxy"); ok {
			t.Errorf("egressproxy is a category (of %v); want it to name the EgressProxy XR", got)
		}
		gvk, err := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)).KindFor(schema.GroupVersionResource{Resource: "egressproxy"})
		if err != nil || gvk.GroupKind() != gvkXR.GroupKind() {
			t.Errorf("egressproxy resolves to %v (%v); want %v", gvk, err, gvkXR.GroupKind())
		}
		got, _ := exp.Expand("egressproxy-all")
		var names []string
		for _, gr := range got {
			names = append(names, gr.String())
		}
		for _, want := range []string{"egressproxies.platform.egressproxy.io", "xegressproxies.legacy.platform.egressproxy.io",
			"egressproxyclaims.legacy.platform.egressproxy.io", "podproxies.proxy.m.egressproxy.io", "podproxies.proxy.egressproxy.io"} {
			if !slices.Contains(names, want) {
				t.Errorf("kubectl get egressproxy-all lists %v; want %s among them", names, want)
			}
		}
	})

	// The render kit: what `crossplane render` prints is what core
	// composes, for every class.
	t.Run("RenderMatchesCore", func(t *testing.T) {
		renderMatchesCore(t, e.Kube)
	})

	t.Run("NamespacedEgressProxy", func(t *testing.T) {
		t.Parallel()
		xr := newObject(gvkXR, "team-a", "payments", map[string]any{
			"class":              "standard",
			"allowedClientCIDRs": []any{"127.0.0.0/8"},
			"allowedPorts":       []any{int64(443), e.port},
		})
		t0 := time.Now()
		e.create(t, xr)
		e.ready(t, xr, 90*time.Second)
		t.Logf("EgressProxy Ready %.2fs after creation", time.Since(t0).Seconds())

		mr := e.get(t, gvkPodNS, "team-a", "payments")
		if c, _ := localcrossplane.Condition(mr, "Ready"); c != "True" {
			t.Errorf("PodProxy team-a/payments Ready=%s", c)
		}
		if ref := mr.GetOwnerReferences(); len(ref) != 1 || ref[0].UID != xr.GetUID() {
			t.Errorf("PodProxy owners %v; want the EgressProxy", ref)
		}
		d := e.ConnectionSecret(t, "team-a", "payments-proxy", "")
		e.ConnectionSecret(t, "team-a", "payments-backend", "") // the PodProxy's own, read by the function
		if d["url"] != "http://"+d["host"]+":3128" || d["username"] != "" {
			t.Errorf("connection Secret %v; want url http://host:3128 and no credentials", d)
		}
		checkProxyKeys(t, "the EgressProxy's connection Secret", d)
		if code, _ := e.request(t, d["url"]); code != http.StatusOK {
			t.Errorf("GET through %s = %d; want 200", d["url"], code)
		}
		if st, _, _ := unstructured.NestedString(e.get(t, gvkXR, "team-a", "payments").Object, "status", "proxy", "endpoint"); st != d["host"]+":3128" {
			t.Errorf("EgressProxy status.proxy.endpoint = %q; want %s:3128", st, d["host"])
		}

		e.deleteAndWait(t, xr, 6*time.Second)
		e.gone(t, "the PodProxy, its pods and the Secret", func() []string {
			left := e.leftovers(t, "team-a", "payments-proxy", gvkPodNS, "team-a", "payments")
			// The PodProxy's own connection Secret, which the function
			// reads, goes with it.
			if err := e.Kube.Get(context.Background(), types.NamespacedName{Namespace: "team-a", Name: "payments-backend"}, &corev1.Secret{}); err == nil {
				left = append(left, "Secret team-a/payments-backend")
			}
			return left
		})
	})

	// The other backends cannot run here, but their classes must compose
	// managed resources that Crossplane applies and their CRDs admit.
	t.Run("EveryBackendComposes", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct{ class, kind, machineType string }{
			{"dedicated", "KVMProxy", "medium"},
			{"datacenter", "ProxmoxProxy", "medium"},
			{"cloud", "GCPProxy", "medium"},
		} {
			e.create(t, newObject(gvkXR, "team-c", c.class, map[string]any{
				"class": c.class, "size": "medium", "allowedClientCIDRs": []any{"10.0.0.0/8"}, "auth": true,
			}))
			gvk := schema.GroupVersionKind{Group: "proxy.m.egressproxy.io", Version: "v1alpha1", Kind: c.kind}
			testenv.WaitFor(t, c.kind+" team-c/"+c.class, 30*time.Second, func() (bool, string) {
				mr, err := e.tryGet(gvk, "team-c", c.class)
				if err != nil {
					xr, _ := e.tryGet(gvkXR, "team-c", c.class)
					return false, err.Error() + "; composite: " + localcrossplane.Conditions(xr)
				}
				mt, _, _ := unstructured.NestedString(mr.Object, "spec", "forProvider", "machineType")
				auth, _, _ := unstructured.NestedBool(mr.Object, "spec", "forProvider", "proxy", "auth", "enabled")
				return mt == c.machineType && auth, fmt.Sprintf("machineType %q, auth %v", mt, auth)
			})
			if st, _ := localcrossplane.Condition(e.get(t, gvkXR, "team-c", c.class), "Ready"); st == "True" {
				t.Errorf("EgressProxy %s Ready with a %s whose backend does not exist here", c.class, c.kind)
			}
		}
	})

	// What the managed resource would refuse is refused on the composite,
	// naming the composite's own fields; a class left to the Composition
	// cannot be given later.
	t.Run("AdmissionSpeaksTheCompositesFields", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			name string
			spec map[string]any
			want []string
		}{
			{"open", map[string]any{"allowedClientCIDRs": []any{"0.0.0.0/0"}}, []string{"spec.allowedClientCIDRs", "without auth", "auth: true"}},
			{"hostbits", map[string]any{"allowedClientCIDRs": []any{"10.20.3.7/16"}, "auth": true}, []string{"spec.allowedClientCIDRs[0]", "host bits"}},
		} {
			err := e.Kube.Create(context.Background(), newObject(gvkXR, "team-a", c.name, c.spec))
			for _, w := range c.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("EgressProxy %s: %v; want a rejection saying %q", c.name, err, w)
				}
			}
		}
		xr := newObject(gvkXR, "team-a", "classless", map[string]any{"allowedClientCIDRs": []any{"10.0.0.0/8"}, "auth": true})
		e.create(t, xr)
		// A merge patch: Crossplane writes the composite meanwhile, and an
		// update could meet a conflict before the rule.
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"class":"dedicated"}}`))
		if err := e.Kube.Patch(context.Background(), xr, patch); err == nil || !strings.Contains(err.Error(), "class is fixed once created") {
			t.Errorf("giving a classless EgressProxy a class later: %v; want a rejection saying class is fixed once created", err)
		}
		e.deleteAndWait(t, xr, 0)
	})

	t.Run("UnknownClassIsRefusedWithTheChoices", func(t *testing.T) {
		t.Parallel()
		xr := newObject(gvkXR, "team-a", "premium", map[string]any{
			"class":              "premium",
			"allowedClientCIDRs": []any{"10.0.0.0/8"},
		})
		e.create(t, xr)
		e.conditionFalse(t, xr, "Synced", unknownClass, 30*time.Second)
		if _, err := e.tryGet(gvkPodNS, "team-a", "premium"); !kerrors.IsNotFound(err) {
			t.Errorf("a PodProxy for a refused request: %v", err)
		}
		e.deleteAndWait(t, xr, 0)
	})

	// A claim's user reads the claim, not the cluster-scoped composite:
	// the refusal comes there as a condition.
	t.Run("UnknownClassReachesTheClaim", func(t *testing.T) {
		t.Parallel()
		claim := newObject(gvkClaim, "team-b", "premium", map[string]any{
			"class":                      "premium",
			"allowedClientCIDRs":         []any{"10.0.0.0/8"},
			"writeConnectionSecretToRef": map[string]any{"name": "premium-proxy"},
		})
		e.create(t, claim)
		e.conditionFalse(t, claim, "RequestAccepted", unknownClass, 60*time.Second)
		e.deleteAndWait(t, claim, 0)
	})

	t.Run("Claim", func(t *testing.T) {
		t.Parallel()
		claim := newObject(gvkClaim, "team-b", "orders", map[string]any{
			"allowedClientCIDRs":         []any{"127.0.0.0/8"},
			"allowedPorts":               []any{int64(443), e.port},
			"writeConnectionSecretToRef": map[string]any{"name": "orders-proxy"},
		})
		t0 := time.Now()
		e.create(t, claim)
		e.ready(t, claim, 90*time.Second)
		t.Logf("EgressProxyClaim Ready %.2fs after creation", time.Since(t0).Seconds())

		claim = e.get(t, gvkClaim, "team-b", "orders")
		xrName, _, _ := unstructured.NestedString(claim.Object, "spec", "resourceRef", "name")
		if xrName == "" {
			t.Fatal("the claim has no spec.resourceRef")
		}
		xrUID := string(e.get(t, gvkLegacy, "", xrName).GetUID())
		mr := e.get(t, gvkPodClus, "", xrName)
		if c, _ := localcrossplane.Condition(mr, "Ready"); c != "True" {
			t.Errorf("PodProxy %s Ready=%s", xrName, c)
		}
		d := e.ConnectionSecret(t, "team-b", "orders-proxy", "")
		// Where it came from: the PodProxy's and the composite's Secrets.
		e.ConnectionSecret(t, "crossplane-system", xrUID+"-backend", "")
		e.ConnectionSecret(t, "crossplane-system", xrUID, "")
		checkProxyKeys(t, "the claim's connection Secret", d)
		if d["url"] != "http://"+d["host"]+":3128" {
			t.Errorf("claim's connection Secret %v; want url http://host:3128", d)
		}
		if code, _ := e.request(t, d["url"]); code != http.StatusOK {
			t.Errorf("GET through %s = %d; want 200", d["url"], code)
		}

		// The team turns authentication on: the change goes from the
		// claim to the composite, the function, the PodProxy, a new pod,
		// and back as credentials in the claim's Secret.
		e.Update(t, claim, func() { _ = unstructured.SetNestedField(claim.Object, true, "spec", "auth") })
		mark := time.Now()
		d2 := e.ConnectionSecret(t, "team-b", "orders-proxy", d["host"])
		e.ready(t, claim, 60*time.Second)
		t.Logf("auth rolled out to %s %.2fs after the change", d2["host"], time.Since(mark).Seconds())
		if d2["username"] == "" || len(d2["password"]) < 16 || d2["url"] != fmt.Sprintf("http://%s:%s@%s:3128", d2["username"], d2["password"], d2["host"]) {
			t.Errorf("claim's Secret with auth: username %q, password of %d chars, url with credentials %v",
				d2["username"], len(d2["password"]), strings.Contains(d2["url"], d2["password"]))
		}
		if code, _ := e.request(t, d2["url"]); code != http.StatusOK {
			t.Errorf("GET with the Secret's credentials = %d; want 200", code)
		}
		if code, _ := e.request(t, "http://"+net.JoinHostPort(d2["host"], "3128")); code != http.StatusProxyAuthRequired {
			t.Errorf("GET without credentials = %d; want 407", code)
		}

		e.deleteAndWait(t, claim, 0)
		e.gone(t, "the composite, the PodProxy, its pods and the Secrets", func() []string {
			left := e.leftovers(t, "team-b", "orders-proxy", gvkPodClus, "", xrName)
			if _, err := e.tryGet(gvkLegacy, "", xrName); err == nil {
				left = append(left, "XEgressProxy "+xrName)
			}
			// The composite's and the PodProxy's connection Secrets in
			// crossplane-system.
			for _, n := range []string{xrUID, xrUID + "-backend"} {
				if err := e.Kube.Get(context.Background(), types.NamespacedName{Namespace: "crossplane-system", Name: n}, &corev1.Secret{}); err == nil {
					left = append(left, "Secret crossplane-system/"+n)
				}
			}
			return left
		})
	})
}

// checkProxyKeys checks that a composite's or claim's connection Secret d
// passed on the keys clients read from the environment (envFrom).
func checkProxyKeys(t *testing.T, what string, d map[string]string) {
	t.Helper()
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		if d[k] != d["url"] {
			t.Errorf("%s: %s = %q; want the url", what, k, d[k])
		}
	}
	if d["endpoint"] != d["host"]+":"+d["port"] || !strings.HasPrefix(d["NO_PROXY"], "localhost,") || d["no_proxy"] != d["NO_PROXY"] {
		t.Errorf("%s: endpoint %q, NO_PROXY %q, no_proxy %q; want host:port and the default list", what, d["endpoint"], d["NO_PROXY"], d["no_proxy"])
	}
}

func newObject(gvk schema.GroupVersionKind, ns, name string, specm map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": specm}}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

func (e *env) create(t testing.TB, u *unstructured.Unstructured) {
	t.Helper()
	if err := e.Kube.Create(context.Background(), u); err != nil {
		t.Fatal(err)
	}
}

func (e *env) tryGet(gvk schema.GroupVersionKind, ns, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	err := e.Kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, u)
	return u, err
}

func (e *env) get(t testing.TB, gvk schema.GroupVersionKind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := e.tryGet(gvk, ns, name)
	if err != nil {
		t.Fatalf("%s %s/%s: %v", gvk.Kind, ns, name, err)
	}
	return u
}

// ready waits until u (a composite or a claim) is Ready.
func (e *env) ready(t testing.TB, u *unstructured.Unstructured, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, u.GetKind()+" "+u.GetName()+" Ready", timeout, func() (bool, string) {
		got, err := e.tryGet(u.GroupVersionKind(), u.GetNamespace(), u.GetName())
		if err != nil {
			return false, err.Error()
		}
		u.Object = got.Object
		st, _ := localcrossplane.Condition(got, "Ready")
		return st == "True", localcrossplane.Conditions(got)
	})
}

// deleteAndWait deletes u, no sooner than minAge after its creation (see
// internal/controller/pod's deleteAndWait: the provider's creation grace
// period), and waits until it is gone.
// unknownClass is the function's refusal of class premium.
const unknownClass = `class "premium" is not offered; classes offered: cloud, datacenter, dedicated, standard`

// conditionFalse waits for u's condition cond to be False with a message
// holding want.
func (e *env) conditionFalse(t testing.TB, u *unstructured.Unstructured, cond, want string, timeout time.Duration) {
	t.Helper()
	gvk := u.GroupVersionKind()
	testenv.WaitFor(t, fmt.Sprintf("%s %s %s=False with %q", gvk.Kind, u.GetName(), cond, want), timeout, func() (bool, string) {
		got, err := e.tryGet(gvk, u.GetNamespace(), u.GetName())
		if err != nil {
			return false, err.Error()
		}
		st, msg := localcrossplane.Condition(got, cond)
		return st == "False" && strings.Contains(msg, want), localcrossplane.Conditions(got)
	})
}

func (e *env) deleteAndWait(t testing.TB, u *unstructured.Unstructured, minAge time.Duration) {
	t.Helper()
	if wait := time.Until(u.GetCreationTimestamp().Add(minAge)); wait > 0 {
		time.Sleep(wait)
	}
	if err := e.Kube.Delete(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, u.GetKind()+" "+u.GetName()+" to be gone", 90*time.Second, func() (bool, string) {
		got, err := e.tryGet(u.GroupVersionKind(), u.GetNamespace(), u.GetName())
		if kerrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, fmt.Sprintf("finalizers %v; %s", got.GetFinalizers(), localcrossplane.Conditions(got))
	})
}

// leftovers lists what remains of a proxy: its connection Secret, its
// managed resource, and the Deployments, pods and Secrets the provider
// made for it.
func (e *env) leftovers(t testing.TB, secretNS, secret string, gvk schema.GroupVersionKind, ns, name string) []string {
	t.Helper()
	ctx := context.Background()
	var left []string
	if err := e.Kube.Get(ctx, types.NamespacedName{Namespace: secretNS, Name: secret}, &corev1.Secret{}); err == nil {
		left = append(left, "Secret "+secretNS+"/"+secret)
	}
	if mr, err := e.tryGet(gvk, ns, name); err == nil {
		left = append(left, fmt.Sprintf("%s %s (%s)", gvk.Kind, name, localcrossplane.Conditions(mr)))
	}
	for _, l := range []client.ObjectList{&appsv1.DeploymentList{}, &corev1.PodList{}, &corev1.SecretList{}} {
		if err := e.Kube.List(ctx, l, client.InNamespace(proxyNS), client.HasLabels{kubernetes.LabelUID}); err != nil {
			t.Fatal(err)
		}
		switch l := l.(type) {
		case *appsv1.DeploymentList:
			for _, o := range l.Items {
				if strings.Contains(o.Name, name) {
					left = append(left, "Deployment "+o.Name)
				}
			}
		case *corev1.PodList:
			for _, o := range l.Items {
				if strings.Contains(o.Name, name) {
					left = append(left, "Pod "+o.Name)
				}
			}
		case *corev1.SecretList:
			for _, o := range l.Items {
				if strings.Contains(o.Name, name) {
					left = append(left, "Secret "+o.Name)
				}
			}
		}
	}
	return left
}

func (e *env) gone(t testing.TB, what string, left func() []string) {
	t.Helper()
	testenv.WaitFor(t, what+" to be gone", 90*time.Second, func() (bool, string) {
		l := left()
		return len(l) == 0, strings.Join(l, ", ")
	})
}

// request sends one GET to the upstream through proxyURL (credentials from
// its userinfo, if any) and returns the status and Squid's error code.
func (e *env) request(t testing.TB, proxyURL string) (int, string) {
	t.Helper()
	r := testenv.GetThroughProxy(t, proxyURL, e.upstream)
	return r.Status, r.SquidError
}
