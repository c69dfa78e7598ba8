package pod_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/pod"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

const (
	installation = "e2e"
	proxyNS      = "egress-proxies"
	// holdFinalizer holds a pod being deleted, as its grace period would.
	holdFinalizer = "test.egressproxy.io/hold"
)

// env is the provider's controllers, set up as cmd/provider sets them up,
// running in-process on a real control plane (with the garbage collector
// and the Deployment controller), with the kubelet stand-in running a real
// Squid per pod, and an HTTP server for the proxies to reach.
type env struct {
	*providerenv.Env
	upstream string // http://<a test host's address>:<port>/
	port     int32  // the upstream's port
	// patience multiplies the waits: a real node pulls, starts and probes
	// containers, on a machine other tests share.
	patience int
}

// within is d, times the env's patience.
func (e *env) within(d time.Duration) time.Duration { return d * time.Duration(max(e.patience, 1)) }

// noProxy is the connection Secrets' NO_PROXY: the default and what the
// config "pods" adds.
const noProxy = "localhost,127.0.0.1,::1,.svc,.cluster.local,.corp.example"

func TestMain(m *testing.M) { testenv.Main(m) } // and the Go client of testenv.FetchWithEnv

func start(t *testing.T) *env {
	t.Helper()
	bin := providerenv.RequireSquid(t)
	e := startProvider(t, controlplane.Options{ControllerManager: true}, 1, "")
	e.StartKubelet(t, bin, "")
	var port int
	e.upstream, port = testenv.Upstream(t)
	e.port = int32(port)
	e.createConfigs(t, "")
	return e
}

// startProvider runs the provider's controllers, every kind, on a control
// plane with o (until t ends), with the waits patience times as long, and
// creates the namespaces the tests use. With a defaultImage, it runs the
// PodProxy kind alone, whose kubernetes blocks naming no image run that
// one (pod.Options.DefaultImage) instead of the build's default.
func startProvider(t *testing.T, o controlplane.Options, patience int, defaultImage string) *env {
	t.Helper()
	var bindings func(ctrl.Manager, external.Options) []external.Binding
	if defaultImage != "" {
		bindings = func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			return []external.Binding{pod.New(mgr, pod.Options{DefaultImage: defaultImage})}
		}
	}
	return &env{patience: patience, Env: providerenv.Start(t, providerenv.Options{
		ControlPlane: o, InstallationID: installation, Bindings: bindings,
		// Long: the watches, not the polls, must make the proxies Ready.
		NotReadyPollInterval: 30 * time.Second,
		Namespaces:           []string{proxyNS, "team-a", "team-b"},
		Timeout:              30 * time.Second * time.Duration(patience),
	})}
}

// createConfigs creates the ProviderConfigs the tests use; image is the
// kubernetes blocks' Squid image ("" for the driver's default).
func (e *env) createConfigs(t *testing.T, image string) {
	t.Helper()
	block := func(ns string) *spec.KubernetesConfig {
		return &spec.KubernetesConfig{
			Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity},
			Namespace:   ns,
			Image:       image,
		}
	}
	for _, o := range []client.Object{
		&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{NoProxy: []string{".corp.example", ".svc"}, Kubernetes: block(proxyNS)}}},
		// A namespaced config never uses the provider's own identity
		// (refused at admission): the team's own kubeconfig, in its
		// namespace.
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "team-kubeconfig", Namespace: "team-b"}, Data: map[string][]byte{"kubeconfig": e.ControlPlane.Kubeconfig}},
		&nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "team-pods", Namespace: "team-b"},
			Spec: nsv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{
				Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceSecret, SecretRef: &spec.SecretKeySelector{Name: "team-kubeconfig", Key: "kubeconfig"}},
				Namespace:   proxyNS,
			}}}},
		// The upstream is the echo endpoint too: it answers with the
		// address a request came from.
		&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "pods-echo"},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: func() *spec.KubernetesConfig {
				b := block(proxyNS)
				b.EgressCheck = &spec.EgressCheck{URL: testenv.EchoURL(e.upstream)}
				return b
			}()}}},
		&clusterv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
			Spec: clusterv1alpha1.ProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: block(proxyNS)}}},
		&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-kvm"},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{
				Credentials:  spec.KVMCredentials{SSHKeySecretRef: spec.SecretKeySelector{Namespace: "crossplane-system", Name: "ssh", Key: "key"}, InsecureIgnoreHostKey: true},
				Images:       map[string]spec.KVMImage{"debian-12": {URL: "https://example.com/d.qcow2"}},
				MachineTypes: map[string]spec.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 512}},
				Hosts:        []spec.KVMHost{{Name: "beelink", Address: "10.0.0.5:22", User: "proxy", Bridge: "br0"}},
			}}}},
	} {
		e.Create(t, o)
	}
}

// get sends one request to the upstream through proxyURL (credentials from
// its userinfo, if any) and returns the status and Squid's error code.
func (e *env) get(t *testing.T, proxyURL string) (int, string) {
	t.Helper()
	r := testenv.GetThroughProxy(t, proxyURL, e.upstream)
	return r.Status, r.SquidError
}

// objects lists what exists of the proxy with this MR UID: Deployment,
// ReplicaSet and pods (running), Secret, NetworkPolicy, Service and
// PodDisruptionBudget.
func (e *env) objects(t *testing.T, uid types.UID) []string {
	t.Helper()
	return append(e.running(t, uid), e.list(t, uid, &corev1.SecretList{}, &networkingv1.NetworkPolicyList{}, &corev1.ServiceList{}, &policyv1.PodDisruptionBudgetList{})...)
}

// running lists what runs, or makes, the pod of the proxy with this MR
// UID: its Deployment, ReplicaSet and pods.
func (e *env) running(t *testing.T, uid types.UID) []string {
	t.Helper()
	return e.list(t, uid, &appsv1.DeploymentList{}, &appsv1.ReplicaSetList{}, &corev1.PodList{})
}

// list lists the objects of lists' kinds labelled with this MR UID.
func (e *env) list(t *testing.T, uid types.UID, lists ...client.ObjectList) []string {
	t.Helper()
	sel := client.MatchingLabels{kubernetes.LabelUID: string(uid)}
	var out []string
	for _, l := range lists {
		if err := e.Kube.List(context.Background(), l, sel); err != nil {
			t.Fatal(err)
		}
		items, _ := apimeta.ExtractList(l)
		for _, o := range items {
			co, _ := o.(client.Object)
			out = append(out, fmt.Sprintf("%T %s/%s", o, co.GetNamespace(), co.GetName()))
		}
	}
	return out
}

// deleteAndWait deletes mg and waits until it is gone: a few seconds (the
// Deployment goes at once, the resource once its pod has).
func (e *env) deleteAndWait(t *testing.T, mg resource.Managed) time.Duration {
	t.Helper()
	start := time.Now()
	e.Delete(t, mg, func() string { return fmt.Sprint("objects ", e.objects(t, mg.GetUID())) })
	return time.Since(start)
}

// deleteLeavingNothing deletes mg, waits until it is gone and fails t if
// its pod, or what makes one, remains, or if the garbage collector does not
// remove the rest (the Secret, NetworkPolicy and Service, owned by the
// Deployment).
func (e *env) deleteLeavingNothing(t *testing.T, mg resource.Managed) {
	t.Helper()
	uid := mg.GetUID()
	t.Logf("gone %.2fs after the delete", e.deleteAndWait(t, mg).Seconds())
	if left := e.running(t, uid); len(left) != 0 {
		t.Errorf("after the PodProxy is gone, these remain: %v", left)
	}
	testenv.WaitFor(t, "the garbage collector to remove the rest", 20*time.Second, func() (bool, string) {
		left := e.objects(t, uid)
		return len(left) == 0, fmt.Sprintf("these remain: %v", left)
	})
}

// checkChallenged asserts that the proxy of the connection Secret d
// challenges a request without credentials and one with a wrong password.
func (e *env) checkChallenged(t *testing.T, d map[string]string) {
	t.Helper()
	addr := net.JoinHostPort(d["host"], d["port"])
	if code, _ := e.get(t, "http://"+addr); code != http.StatusProxyAuthRequired {
		t.Errorf("GET without credentials = %d; want 407", code)
	}
	if code, _ := e.get(t, fmt.Sprintf("http://%s:not-the-password@%s", d["username"], addr)); code != http.StatusProxyAuthRequired {
		t.Errorf("GET with a wrong password = %d; want 407", code)
	}
}

// checkObjects asserts the objects of a proxy: marked, owned by the
// Deployment (which a cluster-scoped PodProxy owns), and the pod running
// the Secret's configuration.
func (e *env) checkObjects(t *testing.T, mg resource.Managed, service bool) {
	t.Helper()
	ctx := context.Background()
	name := meta.GetExternalName(mg)
	key := types.NamespacedName{Namespace: proxyNS, Name: name}
	dep := &appsv1.Deployment{}
	if err := e.Kube.Get(ctx, key, dep); err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{
		kubernetes.LabelManagedBy: kubernetes.ManagedBy, kubernetes.LabelName: name,
		kubernetes.LabelUID: string(mg.GetUID()), kubernetes.LabelInstallation: installation,
	}
	sec := &corev1.Secret{}
	if err := e.Kube.Get(ctx, key, sec); err != nil {
		t.Fatal(err)
	}
	// The NetworkPolicy saying below Squid what Squid denies, and
	// squid.conf denying the cluster's own networks: its ServiceCIDR (the
	// control plane's default) and the API server's address.
	np := &networkingv1.NetworkPolicy{}
	if err := e.Kube.Get(ctx, key, np); err != nil {
		t.Fatalf("the proxy's NetworkPolicy: %v", err)
	}
	if fmt.Sprint(np.Spec.PolicyTypes) != "[Egress]" || len(np.Spec.Egress) != 2 {
		t.Errorf("NetworkPolicy %s: types %v, %d egress rules; want Egress, DNS and the allowed destinations", np.Name, np.Spec.PolicyTypes, len(np.Spec.Egress))
	}
	// The ACL may take several lines, and the Service network may be
	// merged with a neighbour (the node's pod network) into one prefix.
	var never []netip.Prefix
	for _, l := range strings.Split(string(sec.Data[kubernetes.KeySquidConf]), "\n") {
		if rest, ok := strings.CutPrefix(l, "acl never_dst dst "); ok {
			for _, f := range strings.Fields(rest) {
				if p, err := netip.ParsePrefix(f); err == nil {
					never = append(never, p)
				}
			}
		}
	}
	svcCIDRs := &networkingv1.ServiceCIDRList{}
	if err := e.Kube.List(ctx, svcCIDRs); err != nil || len(svcCIDRs.Items) == 0 {
		t.Fatalf("ServiceCIDRs: %v (%d)", err, len(svcCIDRs.Items))
	}
	for _, c := range svcCIDRs.Items[0].Spec.CIDRs {
		want := netip.MustParsePrefix(c)
		if !slices.ContainsFunc(never, func(p netip.Prefix) bool { return p.Bits() <= want.Bits() && p.Contains(want.Addr()) }) {
			t.Errorf("squid.conf does not deny the Service network %s: never_dst %v", c, never)
		}
	}
	objs := []client.Object{dep, sec, np}
	if service {
		svc := &corev1.Service{}
		if err := e.Kube.Get(ctx, key, svc); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, svc)
	}
	for _, o := range objs {
		for k, v := range wantLabels {
			if o.GetLabels()[k] != v {
				t.Errorf("%T %s: label %s=%q; want %q", o, o.GetName(), k, o.GetLabels()[k], v)
			}
		}
		if o == client.Object(dep) {
			// The root, owned by the PodProxy where the garbage collector
			// can find it: cluster-scoped, or in the Deployment's namespace
			// (every config here is this cluster's).
			refs := o.GetOwnerReferences()
			owned := mg.GetNamespace() == "" || mg.GetNamespace() == proxyNS
			if owned && (len(refs) != 1 || refs[0].UID != mg.GetUID() || refs[0].Kind != "PodProxy" || ptr.Deref(refs[0].Controller, false)) ||
				!owned && len(refs) != 0 {
				t.Errorf("the Deployment has owners %v; want the PodProxy alone (not as controller) = %v", refs, owned)
			}
			continue
		}
		if refs := o.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != dep.UID || !ptr.Deref(refs[0].BlockOwnerDeletion, false) {
			t.Errorf("%T %s: owner references %+v; want the Deployment, blocking its deletion", o, o.GetName(), refs)
		}
	}
	if dep.Annotations[kubernetes.AnnotationSpecHash] == "" || dep.Annotations[kubernetes.AnnotationCreatedAt] == "" {
		t.Errorf("Deployment annotations %v; want the spec hash and the creation time", dep.Annotations)
	}
	files := squid.Files{SquidConf: string(sec.Data[kubernetes.KeySquidConf]), Htpasswd: string(sec.Data[kubernetes.KeyHtpasswd])}
	if got, want := dep.Spec.Template.Annotations[kubernetes.AnnotationConfigHash], string(sec.Data[kubernetes.KeyConfigHash]); got != want || got == squid.Hash(files) {
		t.Errorf("pod template config hash %q; want the Secret's %q, keyed (not squid.Hash of its files)", got, want)
	}
	sc := dep.Spec.Template.Spec.SecurityContext
	c := dep.Spec.Template.Spec.Containers[0]
	if !ptr.Deref(sc.RunAsNonRoot, false) || ptr.Deref(sc.RunAsUser, 0) == 0 || !ptr.Deref(c.SecurityContext.ReadOnlyRootFilesystem, false) ||
		c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("pod runs as root or without limits: pod %+v, container %+v, resources %+v", sc, c.SecurityContext, c.Resources)
	}
}

// TestPodProxyIntegration is the end-to-end test of PodProxy: the
// provider's controllers on a real control plane, real Squid processes run
// by the kubelet stand-in with the squid.conf the provider wrote, and real
// HTTP requests through the connection Secret's URL.
func TestPodProxyIntegration(t *testing.T) {
	e := start(t)
	ctx := context.Background()

	t.Run("NamespacedProxyServesRollsOutAndGoesAway", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		p := e.ready(t, e.payments("127.0.0.0/8"))
		t.Logf("Ready %.2fs after creation", time.Since(start).Seconds())
		obs := p.Status.AtProvider
		name := meta.GetExternalName(p)
		if obs.State != "Running" || !obs.ProxyReachable || obs.ID != proxyNS+"/"+name || !strings.HasPrefix(obs.IP, "127.") {
			t.Errorf("status.atProvider = %+v", obs)
		}
		d := e.ConnectionSecret(t, "team-a", "payments-proxy", "")
		u := "http://" + obs.IP + ":3128"
		if want := map[string]string{"url": u, "host": obs.IP, "port": "3128", "endpoint": obs.IP + ":3128",
			"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u, "NO_PROXY": noProxy, "no_proxy": noProxy,
		}; fmt.Sprint(d) != fmt.Sprint(want) {
			t.Errorf("connection Secret = %v; want %v (no credentials without auth)", d, want)
		}
		if code, _ := e.get(t, d["url"]); code != http.StatusOK {
			t.Fatalf("GET through %s = %d; want 200", d["url"], code)
		}
		e.checkObjects(t, p, false)

		// Clients from 127.0.0.0/8 no longer allowed: the pod rolls out
		// and the new Squid refuses them.
		e.Update(t, p, func() { p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"10.0.0.0/8"} })
		mark := time.Now()
		d2 := e.ConnectionSecret(t, "team-a", "payments-proxy", d["host"])
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
		t.Logf("rolled out to %s %.2fs after the change", d2["host"], time.Since(mark).Seconds())
		if code, squidErr := e.get(t, d2["url"]); code != http.StatusForbidden || squidErr != "ERR_ACCESS_DENIED 0" {
			t.Errorf("GET from 127.0.0.1 after excluding it = %d %q; want 403 ERR_ACCESS_DENIED", code, squidErr)
		}

		// Back in, with authentication: another rollout; the URL now holds
		// the credentials, and a request without them is challenged.
		e.Update(t, p, func() {
			p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"127.0.0.0/8"}
			p.Spec.ForProvider.Proxy.Auth = &spec.ProxyAuth{Enabled: true, Username: "payments"}
		})
		mark = time.Now()
		d3 := e.ConnectionSecret(t, "team-a", "payments-proxy", d2["host"])
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
		t.Logf("rolled out to %s %.2fs after the change", d3["host"], time.Since(mark).Seconds())
		if d3["username"] != "payments" || len(d3["password"]) != 32 ||
			d3["url"] != fmt.Sprintf("http://payments:%s@%s:3128", d3["password"], d3["host"]) {
			t.Errorf("connection Secret with auth: username %q, password of %d chars, url with credentials %v, host %q",
				d3["username"], len(d3["password"]), strings.Contains(d3["url"], d3["password"]), d3["host"])
		}
		if code, _ := e.get(t, d3["url"]); code != http.StatusOK {
			t.Errorf("GET with the connection Secret's credentials = %d; want 200", code)
		}
		// The Secret as a client's whole environment (envFrom) is all it
		// needs: the page comes back, over a connection to the proxy.
		for _, f := range testenv.FetchWithEnv(t, d3, e.upstream) {
			if f.Status != http.StatusOK || f.Body != "hello from upstream" || f.Remote != net.JoinHostPort(d3["host"], d3["port"]) {
				t.Errorf("%s with the connection Secret as its environment: %d %q via %s; want 200 from the upstream via the proxy at %s",
					f.Client, f.Status, f.Body, f.Remote, d3["endpoint"])
			}
		}
		e.checkChallenged(t, d3)

		e.deleteLeavingNothing(t, p)
		testenv.WaitFor(t, "the stand-in to stop the proxy's Squid", 10*time.Second, func() (bool, string) {
			conn, err := (&net.Dialer{Timeout: time.Second}).Dial("tcp", net.JoinHostPort(d3["host"], d3["port"]))
			if err == nil {
				_ = conn.Close()
			}
			return err != nil, "still answering"
		})
	})

	// The egress check through real Squid: the address published is the
	// one the upstream saw through the proxy (this machine's side of the
	// test host's veth pair), not the pod's; a new pod is checked again;
	// and the check works from the provider's address once it is no
	// client, without opening the proxy to it.
	t.Run("EgressAddressVerifiedThroughTheProxy", func(t *testing.T) {
		t.Parallel()
		p := nsPodProxy("team-a", "verified", "ClusterProviderConfig", "pods-echo")
		p.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "verified-proxy"}
		p.Spec.ForProvider.Proxy.AllowedPorts = []int32{443, e.port}
		e.ready(t, p)
		e.WaitForCondition(t, p, spec.TypeEgressVerified, corev1.ConditionTrue, "saw")
		obs := p.Status.AtProvider
		d := e.ConnectionSecret(t, "team-a", "verified-proxy", "")
		r, err := testenv.TryGetThroughProxy(d["url"], testenv.EchoURL(e.upstream))
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("GET the echo through the proxy = %+v, %v", r, err)
		}
		seen := strings.TrimSpace(r.Body)
		if obs.EgressIP != seen || seen == obs.IP || obs.EgressIPSource != spec.EgressIPVerified || obs.EgressIPVerifiedAt == nil || d["egressIP"] != seen {
			t.Errorf("egressIP %q (%s at %v), connection Secret %q, pod %s; want %s, the address the upstream saw, Verified", obs.EgressIP, obs.EgressIPSource, obs.EgressIPVerifiedAt, d["egressIP"], obs.IP, seen)
		}

		mark := time.Now().Add(-time.Second)
		e.Update(t, p, func() { p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"10.0.0.0/8"} })
		d2 := e.ConnectionSecret(t, "team-a", "verified-proxy", d["host"])
		testenv.WaitFor(t, "the new pod's egress check", e.within(30*time.Second), func() (bool, string) {
			if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return false, err.Error()
			}
			o := p.Status.AtProvider
			return o.IP == d2["host"] && o.EgressIPVerifiedAt != nil && o.EgressIPVerifiedAt.After(mark), fmt.Sprintf("ip %s, egressIP %s verified at %v", o.IP, o.EgressIP, o.EgressIPVerifiedAt)
		})
		if o, c := p.Status.AtProvider, p.GetCondition(spec.TypeEgressVerified); o.EgressIP != seen || c.Status != corev1.ConditionTrue || c.Reason != "Verified" {
			t.Errorf("after the rollout: egressIP %q, EgressVerified %s %s %q; want %s, True Verified", o.EgressIP, c.Status, c.Reason, c.Message, seen)
		}
		if code, squidErr := e.get(t, d2["url"]); code != http.StatusForbidden {
			t.Errorf("GET from 127.0.0.1, no client any more = %d %q; want 403: the check must not open the proxy", code, squidErr)
		}
		e.deleteLeavingNothing(t, p)
	})

	t.Run("ClusterScopedProxyWithServiceAndLegacyConfig", func(t *testing.T) {
		t.Parallel()
		port := testenv.FreePort(t) // not the default, and not one another test's process holds
		p := e.sharedEgress(port, "127.0.0.0/8")
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
		name := meta.GetExternalName(p)
		svc := &corev1.Service{}
		if err := e.Kube.Get(ctx, types.NamespacedName{Namespace: proxyNS, Name: name}, svc); err != nil {
			t.Fatal(err)
		}
		d := e.ConnectionSecret(t, "crossplane-system", "shared-egress", "")
		dns := name + "." + proxyNS + ".svc"
		ps := fmt.Sprint(port)
		if d["host"] != dns || d["port"] != ps || d["endpoint"] != dns+":"+ps || d["username"] != "proxy" || d["password"] == "" ||
			d["HTTP_PROXY"] != fmt.Sprintf("http://proxy:%s@%s:%s", d["password"], dns, ps) {
			t.Errorf("connection Secret: host %q port %q endpoint %q username %q, HTTP_PROXY right: %v; want the Service's DNS name %q, %s, proxy",
				d["host"], d["port"], d["endpoint"], d["username"], d["HTTP_PROXY"] == d["url"], dns, ps)
		}
		if p.Status.AtProvider.IP != svc.Spec.ClusterIP {
			t.Errorf("status.atProvider.ip = %q; want the Service's cluster IP %q", p.Status.AtProvider.IP, svc.Spec.ClusterIP)
		}
		e.checkObjects(t, p, true)
		// No kube-proxy here, so the cluster IP routes nowhere; the pod's
		// own address proves the Squid behind it.
		pod := p.Status.AtProvider.Details["pod"]
		pods := &corev1.Pod{}
		if err := e.Kube.Get(ctx, types.NamespacedName{Namespace: proxyNS, Name: pod}, pods); err != nil {
			t.Fatal(err)
		}
		viaPod := fmt.Sprintf("http://proxy:%s@%s", d["password"], net.JoinHostPort(pods.Status.PodIP, d["port"]))
		if code, _ := e.get(t, viaPod); code != http.StatusOK {
			t.Errorf("GET through the pod behind the Service = %d; want 200", code)
		}

		e.deleteLeavingNothing(t, p)
	})

	// A cluster-scoped PodProxy in the provider's own cluster owns its
	// Deployment: removed without the provider (paused, then its finalizer
	// removed by hand), the garbage collector removes the proxy.
	t.Run("ClusterScopedProxyGoneWithoutTheProviderTakesItsDeployment", func(t *testing.T) {
		t.Parallel()
		p := e.sharedEgress(testenv.FreePort(t), "127.0.0.0/8")
		p.Name = "bypassed-egress"
		p.Spec.WriteConnectionSecretToReference.Name = p.Name
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
		uid := p.GetUID()
		deps := &appsv1.DeploymentList{}
		if err := e.Kube.List(ctx, deps, client.MatchingLabels{kubernetes.LabelUID: string(uid)}); err != nil || len(deps.Items) != 1 {
			t.Fatalf("Deployments of the proxy: %v, %d; want one", err, len(deps.Items))
		}
		if o := deps.Items[0].OwnerReferences; len(o) != 1 || o[0].UID != uid || o[0].Kind != "PodProxy" || o[0].APIVersion != "proxy.egressproxy.io/v1alpha1" {
			t.Fatalf("the Deployment's owners = %+v; want the PodProxy", o)
		}
		patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"crossplane.io/paused":"true"}}}`))
		if err := e.Kube.Patch(ctx, p, patch); err != nil {
			t.Fatal(err)
		}
		if err := e.Kube.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := e.Kube.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the garbage collector to remove the proxy", 60*time.Second, func() (bool, string) {
			left := e.objects(t, uid)
			return len(left) == 0, fmt.Sprintf("these remain: %v", left)
		})
	})

	t.Run("NamespacedProviderConfigOfItsOwnNamespace", func(t *testing.T) {
		t.Parallel()
		e.deleteLeavingNothing(t, e.ready(t, nsPodProxy("team-b", "reports", "ProviderConfig", "team-pods")))
	})

	t.Run("DeletedRightAfterCreateLeavesNothing", func(t *testing.T) {
		t.Parallel()
		p := nsPodProxy("team-b", "fleeting", "ProviderConfig", "team-pods")
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		uid := p.GetUID()
		// As soon as its Deployment exists (the managed reconciler's
		// cache may not have seen it yet), before any pod is Ready.
		testenv.WaitFor(t, "the Deployment of "+p.Name, 20*time.Second, func() (bool, string) {
			return len(e.objects(t, uid)) > 0, "no objects yet"
		})
		e.deleteLeavingNothing(t, p)
	})

	// The Deployment goes at once (in the background); the resource stays
	// while its pod remains, here held by a finalizer as a pod in its grace
	// period is, and goes once the pod has.
	t.Run("ProxyStaysWhileItsPodRemains", func(t *testing.T) {
		t.Parallel()
		p := e.ready(t, nsPodProxy("team-a", "lingering", "ClusterProviderConfig", "pods"))
		uid := p.GetUID()
		pods := &corev1.PodList{}
		if err := e.Kube.List(ctx, pods, client.MatchingLabels{kubernetes.LabelUID: string(uid)}); err != nil || len(pods.Items) != 1 {
			t.Fatalf("the proxy's pods: %v, %d", err, len(pods.Items))
		}
		pod := &pods.Items[0]
		pod.Finalizers = append(pod.Finalizers, holdFinalizer)
		if err := e.Kube.Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		release := func() {
			patch := client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`))
			if err := e.Kube.Patch(context.Background(), pod, patch); err != nil && !kerrors.IsNotFound(err) {
				t.Errorf("releasing pod %s: %v", pod.Name, err)
			}
		}
		defer func() {
			if t.Failed() {
				release()
			}
		}()
		if err := e.Kube.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		stillThere := func(what string) {
			if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p); kerrors.IsNotFound(err) {
				t.Fatalf("the PodProxy went while its pod still exists (%s)", what)
			}
		}
		testenv.WaitFor(t, "the Deployment to go and the pod to be deleted", 20*time.Second, func() (bool, string) {
			stillThere("waiting for the Deployment to go")
			err := e.Kube.Get(ctx, types.NamespacedName{Namespace: proxyNS, Name: meta.GetExternalName(p)}, &appsv1.Deployment{})
			if gerr := e.Kube.Get(ctx, client.ObjectKeyFromObject(pod), pod); gerr != nil {
				t.Fatalf("the held pod: %v", gerr)
			}
			return kerrors.IsNotFound(err) && pod.DeletionTimestamp != nil, fmt.Sprintf("Deployment: %v; pod deleted at %v", err, pod.DeletionTimestamp)
		})
		// Two more reconciles (each asks the driver to delete again, an
		// event): the provider has looked since the Deployment went.
		deletes := func() int32 {
			n := int32(0)
			for _, ev := range e.Events(t, p.Namespace, p.Name) {
				if ev.Reason == "DeletedExternalResource" {
					n += max(ev.Count, 1)
				}
			}
			return n
		}
		since := deletes()
		testenv.WaitFor(t, "two more reconciles of the PodProxy", 30*time.Second, func() (bool, string) {
			stillThere("after its Deployment went")
			n := deletes()
			return n >= since+2, fmt.Sprintf("%d deletes requested, %d when the Deployment went", n, since)
		})
		stillThere("after two more reconciles")
		release()
		e.WaitGone(t, p)
		if left := e.running(t, uid); len(left) != 0 {
			t.Errorf("after the PodProxy is gone, these remain: %v", left)
		}
	})

	// The attack: a PodProxy whose external name is a Secret in the
	// proxies' namespace holding an API key. The provider used to merge
	// squid.conf into it, own it and delete it with the proxy.
	t.Run("ExternalNameOfASecretHoldingAnAPIKey", func(t *testing.T) {
		t.Parallel()
		const apiKey = "sk-S3NT1NEL-41c0e37d2f9a"
		victim := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: proxyNS, Name: "billing-api"}, Data: map[string][]byte{"api-key": []byte(apiKey)}}
		if err := e.Kube.Create(ctx, victim); err != nil {
			t.Fatal(err)
		}
		snapshot := func() string {
			s := &corev1.Secret{}
			if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(victim), s); err != nil {
				t.Fatalf("the victim Secret: %v", err)
			}
			return fmt.Sprintf("rv=%s labels=%v owners=%v data=%q", s.ResourceVersion, s.Labels, s.OwnerReferences, s.Data)
		}
		before := snapshot()
		p := nsPodProxy("team-a", "thief", "ClusterProviderConfig", "pods")
		meta.SetExternalName(p, "billing-api")
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse, "Secret "+proxyNS+"/billing-api exists and was not created by provider-egressproxy for this proxy")
		if strings.Contains(c.Message, apiKey) {
			t.Errorf("the condition holds the victim's data: %s", c.Message)
		}
		if after := snapshot(); after != before {
			t.Errorf("the victim Secret changed:\nbefore %s\nafter  %s", before, after)
		}
		e.deleteAndWait(t, p)
		if after := snapshot(); after != before {
			t.Errorf("the victim Secret changed after the proxy was deleted:\nbefore %s\nafter  %s", before, after)
		}
	})

	t.Run("NamespacedProxyCannotUseAnotherNamespacesProviderConfig", func(t *testing.T) {
		t.Parallel()
		p := nsPodProxy("team-a", "borrower", "ProviderConfig", "team-pods")
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse, `ProviderConfig "team-pods" in namespace "team-a" does not exist`)
		t.Logf("Synced: %s", c.Message)
		if left := e.objects(t, p.GetUID()); len(left) != 0 {
			t.Errorf("objects were created with another namespace's config: %v", left)
		}
		if err := e.Kube.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ReplicatedProxy", func(t *testing.T) {
		t.Parallel()
		e.replicatedProxy(t)
	})

	t.Run("ConfigWithAnotherBackendsBlock", func(t *testing.T) {
		t.Parallel()
		p := nsPodProxy("team-a", "confused", "ClusterProviderConfig", "home-kvm")
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse, "ClusterProviderConfig home-kvm holds a kvm block, but a PodProxy needs a config with a kubernetes block")
		t.Logf("Synced: %s", c.Message)
		if err := e.Kube.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
	})
}

// payments is the namespaced PodProxy team-a/payments of the "pods"
// config, publishing its connection Secret payments-proxy, for clients
// from clients, to ports 443 and the upstream's.
func (e *env) payments(clients string) *nsproxy.PodProxy {
	return &nsproxy.PodProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "payments", Namespace: "team-a"},
		Spec: nsproxy.PodProxySpec{
			ManagedResourceSpec: xpv2.ManagedResourceSpec{
				ProviderConfigReference:          &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "pods"},
				WriteConnectionSecretToReference: &xpv2.LocalSecretReference{Name: "payments-proxy"},
			},
			ForProvider: spec.PodProxyParameters{Proxy: spec.ProxySettings{
				AllowedClientCIDRs: []string{clients},
				AllowedPorts:       []int32{443, e.port},
			}},
		},
	}
}

// sharedEgress is the cluster-scoped PodProxy shared-egress of the
// legacy "pods" config behind a ClusterIP Service, with authentication,
// on port, for clients from clients, to ports 443 and the upstream's;
// its connection Secret is crossplane-system/shared-egress.
func (e *env) sharedEgress(port int32, clients string) *clusterproxy.PodProxy {
	return &clusterproxy.PodProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "shared-egress"},
		Spec: clusterproxy.PodProxySpec{
			ClusterManagedResourceSpec: xpv2.ClusterManagedResourceSpec{
				ProviderConfigReference:          &xpv2.Reference{Name: "pods"},
				WriteConnectionSecretToReference: &xpv2.SecretReference{Namespace: "crossplane-system", Name: "shared-egress"},
			},
			ForProvider: spec.PodProxyParameters{
				Service: &spec.PodService{Type: "ClusterIP"},
				Proxy: spec.ProxySettings{
					Port:               ptr.To(port),
					AllowedClientCIDRs: []string{clients},
					AllowedPorts:       []int32{443, e.port},
					Auth:               &spec.ProxyAuth{Enabled: true},
				},
			},
		},
	}
}

// ready creates p and waits until it is Ready.
func (e *env) ready(t *testing.T, p *nsproxy.PodProxy) *nsproxy.PodProxy {
	t.Helper()
	e.Create(t, p)
	e.WaitReady(t, p)
	return p
}

func nsPodProxy(ns, name, kind, config string) *nsproxy.PodProxy {
	return &nsproxy.PodProxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: nsproxy.PodProxySpec{
			ManagedResourceSpec: xpv2.ManagedResourceSpec{
				ProviderConfigReference: &xpv2.ProviderConfigReference{Kind: kind, Name: config},
			},
			ForProvider: spec.PodProxyParameters{Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"127.0.0.0/8"}}},
		},
	}
}
