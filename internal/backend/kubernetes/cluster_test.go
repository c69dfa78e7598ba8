package kubernetes

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

const kubeconfigTemplate = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://remote.example:6443
    CLUSTER
users:
- name: u
  user:
    USER
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func kubeconfig(cluster, user string) []byte {
	return []byte(strings.NewReplacer("CLUSTER", cluster, "USER", user).Replace(kubeconfigTemplate))
}

func TestRESTConfigFromKubeconfig(t *testing.T) {
	cfg, err := RESTConfigFromKubeconfig(kubeconfig("insecure-skip-tls-verify: true", "token: abc"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://remote.example:6443" || cfg.BearerToken != "abc" || cfg.Timeout == 0 {
		t.Errorf("config: host %q, token set %v, timeout %v", cfg.Host, cfg.BearerToken != "", cfg.Timeout)
	}
	for name, kc := range map[string][]byte{
		"exec plugin":     kubeconfig("insecure-skip-tls-verify: true", "exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh}"),
		"token file":      kubeconfig("insecure-skip-tls-verify: true", "tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"),
		"client key file": kubeconfig("insecure-skip-tls-verify: true", "client-key: /etc/key.pem"),
		"CA file":         kubeconfig("certificate-authority: /etc/ca.pem", "token: abc"),
		"not YAML":        []byte("{{{"),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := RESTConfigFromKubeconfig(kc); !proxy.IsPermanent(err) {
				t.Errorf("RESTConfigFromKubeconfig = %v; want a Permanent refusal", err)
			}
		})
	}
}

func TestRemotePoolsByKubeconfig(t *testing.T) {
	built := 0
	r := &Remote{Max: 2, build: func([]byte, *netguard.Guard) (*Cluster, error) { built++; return &Cluster{}, nil }}
	a, _ := r.Cluster([]byte("a"), nil)
	if again, _ := r.Cluster([]byte("a"), nil); again != a || built != 1 {
		t.Errorf("the same kubeconfig built %d clusters; want 1, pooled", built)
	}
	if b, _ := r.Cluster([]byte("b"), nil); b == a || built != 2 {
		t.Errorf("a rotated kubeconfig did not build a new cluster")
	}
	if _, err := r.Cluster([]byte("c"), nil); err != nil {
		t.Fatal(err)
	}
	if len(r.pool) != 2 {
		t.Errorf("pool holds %d clusters; want at most Max (2)", len(r.pool))
	}
}

// TestRemoteDropsIdleClusters: a kubeconfig no Connect asked for in
// IdleTTL (a deleted config, a rotated Secret) leaves the pool, its
// connections closed; tenants' configs cannot make it grow for ever.
func TestRemoteDropsIdleClusters(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	closed := map[string]bool{}
	r := &Remote{IdleTTL: 10 * time.Minute, now: func() time.Time { return clock },
		build: func(kc []byte, _ *netguard.Guard) (*Cluster, error) {
			return &Cluster{Host: string(kc), closeIdle: func() { closed[string(kc)] = true }}, nil
		}}
	for _, kc := range []string{"a", "b", "c"} {
		if _, err := r.Cluster([]byte(kc), nil); err != nil {
			t.Fatal(err)
		}
	}
	clock = clock.Add(5 * time.Minute)
	_, _ = r.Cluster([]byte("a"), nil)
	clock = clock.Add(6 * time.Minute)
	_, _ = r.Cluster([]byte("a"), nil)
	if len(r.pool) != 1 || !closed["b"] || !closed["c"] || closed["a"] {
		t.Errorf("after 11 minutes without b and c: %d pooled, closed %v; want only a pooled, b and c closed", len(r.pool), closed)
	}
}

func TestStripKeepsWhatGetReads(t *testing.T) {
	req := testRequest()
	dep := buildDeployment(Config{}, req, render(t, req), "spec", now)
	pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: dep.Spec.Template.Labels, Annotations: map[string]string{AnnotationConfigHash: dep.Spec.Template.Annotations[AnnotationConfigHash], "other": "x"}}}
	pod.Spec = dep.Spec.Template.Spec
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.5", HostIP: "10.0.0.1",
		Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "squid", Ready: true, Image: "squid:6"}}}
	before := observe(dep.DeepCopy(), []corev1.Pod{*pod.DeepCopy()}, nil, Config{}.withDefaults().templateHash())

	sd, _ := StripDeployment(dep.DeepCopy())
	sp, _ := StripPod(pod.DeepCopy())
	d, okD := sd.(*appsv1.Deployment)
	p, okP := sp.(*corev1.Pod)
	if !okD || !okP {
		t.Fatalf("StripDeployment and StripPod returned %T and %T", sd, sp)
	}
	after := observe(d, []corev1.Pod{*p}, nil, Config{}.withDefaults().templateHash())
	if diff := cmp.Diff(before, after, cmp.AllowUnexported(observation{})); diff != "" {
		t.Errorf("observe differs on stripped objects (-full +stripped):\n%s", diff)
	}
	if len(d.Spec.Template.Labels) != 0 || len(d.Spec.Template.Annotations) != 1 {
		t.Errorf("stripped Deployment's pod template metadata: %+v; want only the config hash", d.Spec.Template.ObjectMeta)
	}
	if again, _ := StripDeployment(d.DeepCopy()); cmp.Diff(d, again) != "" {
		t.Error("StripDeployment is not idempotent")
	}
	if d.Spec.Selector == nil || len(d.Spec.Template.Spec.Volumes) != 0 {
		t.Errorf("stripped Deployment: selector %v, %d volumes; want the selector kept and the rest of the pod spec gone", d.Spec.Selector, len(d.Spec.Template.Spec.Volumes))
	}
}

// TestTenantClusterAnswersAreNotQuoted: a namespaced config's kubeconfig
// names a server that is not an API server (or one that answers with a
// message of its own): the checks and calls report the status, never
// what it said; refused outright when it is the provider's loopback.
func TestTenantClusterAnswersAreNotQuoted(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte("SENTINEL-internal-service-body"))
	}))
	defer srv.Close()
	kc := []byte(fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: abc}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", srv.URL))
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	r := &Remote{Scheme: scheme}

	allowed := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	cl, err := r.Cluster(kc, allowed)
	if err != nil {
		t.Fatal(err)
	}
	h := cl.Driver("ProviderConfig team-a/c", Config{Namespace: "proxies"}, nil).Check(context.Background())
	msg := fmt.Sprint(h.Targets)
	if strings.Contains(msg, "SENTINEL") || !strings.Contains(msg, "not shown to tenants") {
		t.Errorf("Check of a tenant's cluster = %s, want the status without the body", msg)
	}
	if _, err := cl.Driver("ProviderConfig team-a/c", Config{Namespace: "proxies"}, nil).Get(context.Background(), proxy.Ref{Name: "p"}); err == nil || strings.Contains(err.Error(), "SENTINEL") {
		t.Errorf("Get on a tenant's cluster = %v, want an error without the body", err)
	}

	platform, err := r.Cluster(kc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h := platform.Driver("ClusterProviderConfig c", Config{Namespace: "proxies"}, nil).Check(context.Background()); !strings.Contains(fmt.Sprint(h.Targets), "SENTINEL") {
		t.Errorf("Check of a platform config's cluster = %v, want the server's words", h.Targets)
	}

	seen := hits.Load()
	refused, err := r.Cluster(kc, netguard.New(netguard.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if h := refused.Driver("ProviderConfig team-a/c", Config{Namespace: "proxies"}, nil).Check(context.Background()); !strings.Contains(fmt.Sprint(h.Targets), "does not connect to 127.0.0.1") {
		t.Errorf("Check of a tenant's cluster on loopback = %v, want a refusal", h.Targets)
	}
	if n := hits.Load() - seen; n != 0 {
		t.Errorf("the server on loopback was asked %d times through the guard, want 0", n)
	}
}

// TestTenantClusterCheckDoesNotQuoteItsServer: a tenant's "API server"
// answers its version, its refusals and its headers with a sentinel. The
// health of a namespaced config's cluster holds none of it: the version
// as its numbers, the refusals as their status; a platform config's
// cluster shows the version as it is.
func TestTenantClusterCheckDoesNotQuoteItsServer(t *testing.T) {
	const sentinel = "SENTINEL-9c1d"
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-"+sentinel, sentinel)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/version" {
			_, _ = fmt.Fprintf(w, `{"major":"1","minor":"31","gitVersion":"v1.31.0-%s","platform":"%s"}`, sentinel, sentinel)
			return
		}
		w.WriteHeader(http.StatusForbidden)
		_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"%s refuses","reason":"Forbidden","details":{"name":"%s"},"code":403}`, sentinel, sentinel)
	}))
	defer srv.Close()
	kc := []byte(fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: abc}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", srv.URL))
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	r := &Remote{Scheme: scheme}

	allowed := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	cl, err := r.Cluster(kc, allowed)
	if err != nil {
		t.Fatal(err)
	}
	h := cl.Driver("ProviderConfig team-a/c", Config{Namespace: "proxies"}, nil).Check(context.Background())
	if len(h.Targets) != 1 || h.Healthy() {
		t.Fatalf("Check = %+v; want one unhealthy target", h)
	}
	if got := fmt.Sprintf("%+v", h.Targets); strings.Contains(got, sentinel) {
		t.Errorf("the health of a tenant's cluster quotes its server: %s", got)
	}
	if v := h.Targets[0].Details["serverVersion"]; v != "1.31.0" {
		t.Errorf("serverVersion = %q; want the numbers 1.31.0", v)
	}
	t.Logf("tenant's cluster: %s: %s", h.Targets[0].Reason, h.Targets[0].Message)

	platform, err := r.Cluster(kc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h := platform.Driver("ClusterProviderConfig c", Config{Namespace: "proxies"}, nil).Check(context.Background()); h.Targets[0].Details["serverVersion"] != "v1.31.0-"+sentinel {
		t.Errorf("platform config's serverVersion = %q; want it as answered", h.Targets[0].Details["serverVersion"])
	}
}

// publicResolver resolves every name to a public address, so that a
// server name passes the guard without a lookup leaving the machine.
type publicResolver struct{}

func (publicResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("192.0.2.80")}, nil
}

// TestTenantKubeconfigProxyIsGuarded: a namespaced config's kubeconfig
// names a proxy (proxy-url) on the provider's loopback, behind a server
// name the guard lets through. The provider refuses to connect to the
// proxy, as it would refuse the server there; a proxy in a range the
// platform team opened is used.
func TestTenantKubeconfigProxyIsGuarded(t *testing.T) {
	var connects atomic.Int32
	ln := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		connects.Add(1)
		http.Error(w, "no tunnel here", http.StatusForbidden)
	}))
	defer ln.Close()
	kc := kubeconfig("insecure-skip-tls-verify: true\n    proxy-url: "+ln.URL, "token: abc")
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	r := &Remote{Scheme: scheme}

	tenant := netguard.New(netguard.Options{Resolver: publicResolver{}, Timeout: 2 * time.Second})
	cl, err := r.Cluster(kc, tenant)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cl.Version(ctx); !netguard.IsRefused(err) {
		t.Errorf("Version through a tenant's proxy on loopback = %v; want the guard's refusal", err)
	}
	if n := connects.Load(); n != 0 {
		t.Errorf("the proxy on loopback was connected to %d times; want 0", n)
	}

	opened := netguard.New(netguard.Options{Resolver: publicResolver{}, Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	cl, err = r.Cluster(kc, opened)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Version(ctx); err == nil {
		t.Error("Version through a proxy that refuses to tunnel succeeded")
	}
	if connects.Load() == 0 {
		t.Error("the proxy in a range opened for tenants was not used")
	}
}

// TestTenantClusterRedirectIsNotNamed: a tenant's API server that
// redirects to a name the guard refuses is not followed, and neither a
// read nor the health check names the target.
func TestTenantClusterRedirectIsNotNamed(t *testing.T) {
	srv := httptest.NewTLSServer(http.RedirectHandler("https://sentinel-target.localhost:8443/x", http.StatusFound))
	defer srv.Close()
	kc := []byte(fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: abc}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", srv.URL))
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	cl, err := (&Remote{Scheme: scheme}).Cluster(kc, netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}))
	if err != nil {
		t.Fatal(err)
	}
	d := cl.Driver("ProviderConfig team-a/c", Config{Namespace: "proxies"}, nil)
	if _, err := d.Get(context.Background(), proxy.Ref{Name: "p"}); !netguard.IsRefused(err) || strings.Contains(strings.ToLower(err.Error()), "sentinel") {
		t.Errorf("Get through a redirect = %v, want a refusal that names no target", err)
	}
	if msg := fmt.Sprint(d.Check(context.Background()).Targets); strings.Contains(strings.ToLower(msg), "sentinel") || !strings.Contains(msg, "a redirect from") {
		t.Errorf("Check through a redirect = %s, want a refusal of a redirect that names no target", msg)
	}
}

// TestKubeconfigErrorsDoNotQuoteIt: kubeconfigs that fail to parse or to
// validate where the failing text is a credential. The refusal says what
// is wrong and quotes none of it.
func TestKubeconfigErrorsDoNotQuoteIt(t *testing.T) {
	const sentinel = "S3NTINEL"
	for name, tc := range map[string]struct {
		kubeconfig []byte
		want       string
	}{
		"an alias where a token is":          {kubeconfig("insecure-skip-tls-verify: true", "token: *"+sentinel), "cannot parse the kubeconfig"},
		"a map where a token is":             {kubeconfig("insecure-skip-tls-verify: true", "token: {"+sentinel+": x}"), "kubeconfig"},
		"a proxy in a scheme not taken":      {kubeconfig("proxy-url: socks5h://user:"+sentinel+"@proxy.example:1080", "token: abc"), "proxy-url is not an http, https or socks5 URL"},
		"a proxy password badly escaped":     {kubeconfig("proxy-url: http://user:"+sentinel+"%zz@proxy.example:1080", "token: abc"), "proxy-url is not"},
		"a server with a password":           {[]byte(strings.Replace(string(kubeconfig("insecure-skip-tls-verify: true", "token: abc")), "https://remote.example", "https://admin:"+sentinel+"@remote.example", 1)), "server carries a user name or password"},
		"a password with a token and a cert": {kubeconfig("insecure-skip-tls-verify: true", "{token: "+sentinel+", username: a, password: "+sentinel+"}"), "authentication method"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := RESTConfigFromKubeconfig(tc.kubeconfig)
			if !proxy.IsPermanent(err) {
				t.Fatalf("RESTConfigFromKubeconfig = %v; want a Permanent refusal", err)
			}
			if strings.Contains(err.Error(), sentinel) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("RESTConfigFromKubeconfig = %q; want %q in it and no credential", err, tc.want)
			}
		})
	}
}

// An error from client-go that quotes a credential of the kubeconfig is
// shown without it.
func TestRedactedLeavesOutTheKubeconfigsCredentials(t *testing.T) {
	kc := kubeconfig("proxy-url: http://user:proxy-S3NTINEL@proxy.example:3128", "{token: token-S3NTINEL, client-key-data: a2V5LVMzTlRJTkVM}")
	err := fmt.Errorf("cannot use token-S3NTINEL through http://user:proxy-S3NTINEL@proxy.example:3128 with key-S3NTINEL")
	if got := redacted(kc, err); strings.Contains(got, "S3NTINEL") || !strings.Contains(got, "cannot use (redacted) through (redacted) with (redacted)") {
		t.Errorf("redacted = %q; want every credential replaced", got)
	}
}
