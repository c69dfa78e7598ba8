package gcp_test

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/api/option"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	gcpbackend "github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/controller/health"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

const (
	testInstallation = "gcp-it"
	project          = "egressproxy-it"
	zone             = "europe-west1-b"
	region           = "europe-west1"
	// keySentinel is in the credentials Secret; it must never reach a
	// condition, an event or a log line.
	keySentinel = "KEY-S3NT1NEL-7c1d9e2f4a6b8c0d"
)

// env is a real control plane running the GCPProxy controllers of both
// scopes in-process, their drivers on the real Compute Engine client
// pointed at the fake Compute Engine.
type env struct {
	*providerenv.Env
	srv  *gcptest.Server
	gets *atomic.Int64 // driver Get calls (one per Observe)
	key  string        // the service-account key the fake accepts
	// upstream is a test host's server, the echo endpoint of the config
	// gcp-echo.
	upstream string
}

// countingDriver counts Get, which the controller calls once per Observe.
type countingDriver struct {
	proxy.Driver
	gets *atomic.Int64
}

func (c countingDriver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	c.gets.Add(1)
	return c.Driver.Get(ctx, ref)
}

// start runs the controllers on a control plane started with cp.
func start(t *testing.T, cp controlplane.Options) *env {
	t.Helper()
	srv := gcptest.New(t, project)
	srv.AutoComplete(300 * time.Millisecond)
	gets := &atomic.Int64{}

	// Everything the provider logs, driver included, goes to one buffer
	// that the key sentinel is looked for in.
	logs := &testenv.Buffer{}
	driverLog := funcr.New(func(prefix, args string) { _, _ = fmt.Fprintf(logs, "%s %s\n", prefix, args) }, funcr.Options{Verbosity: 5})
	conn := &gcpbackend.Connector{
		// The production code path minus authentication: the key is read
		// from its Secret and checked, then the clients go to the fake.
		ClientOptions: func(ctx context.Context, c gcpbackend.Credentials) ([]option.ClientOption, error) {
			if !strings.Contains(string(c.Key), keySentinel) {
				return nil, proxy.Permanentf("test: the key Secret was not read")
			}
			return []option.ClientOption{option.WithoutAuthentication()}, nil
		},
		Endpoint: srv.URL,
		Defaults: gcpbackend.Options{FailedOperationHold: time.Minute, Log: &driverLog,
			// The real probe of the guests' real Squid (RunSquid), through
			// the fake's firewall (EnforceFirewall).
			// A dial, not an Ask, so that the probe speaks TLS to a proxy
			// listening with it.
			Prober: &squid.Prober{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if srv.Refuses(addr) {
					return nil, fmt.Errorf("dial tcp %s: i/o timeout", addr)
				}
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}},
		},
	}
	t.Cleanup(func() { _ = conn.Close() })
	key := fmt.Sprintf(`{"type":"service_account","client_email":"it@%s.iam.gserviceaccount.com","private_key":"%s"}`, project, keySentinel)
	block := func() *spec.GCPConfig {
		return &spec.GCPConfig{
			Project:      project,
			Credentials:  spec.GCPCredentials{Source: xpv2.CredentialsSourceSecret, SecretRef: &spec.SecretKeySelector{Namespace: "crossplane-system", Name: "gcp-sa", Key: "key.json"}},
			Network:      "default",
			NetworkTags:  []string{"egress-proxy"},
			DiskSizeGB:   10,
			Zones:        []string{zone},
			Images:       map[string]spec.GCPImage{"ubuntu-2404": {Image: "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"}},
			MachineTypes: map[string]spec.GCPMachineType{"small": {MachineType: "e2-small"}},
		}
	}
	upstream, _ := testenv.Upstream(t)
	echo := block()
	echo.EgressCheck = &spec.EgressCheck{URL: testenv.EchoURL(upstream)}
	e := providerenv.Start(t, providerenv.Options{
		ControlPlane: cp,
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			kind := gcp.New(mgr, gcp.Options{Connector: conn})
			connect := kind.Backend.Connect
			kind.Backend.Connect = func(ctx context.Context, cfg *external.Config) (proxy.Driver, error) {
				d, err := connect(ctx, cfg)
				if err != nil {
					return nil, err
				}
				return countingDriver{Driver: d, gets: gets}, nil
			}
			return []external.Binding{kind}
		},
		InstallationID: testInstallation, PollInterval: time.Second,
		Namespaces: []string{"team-a"},
		Objects: []client.Object{
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gcp-sa", Namespace: "crossplane-system"}, StringData: map[string]string{"key.json": key}},
			&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "gcp-prod"},
				Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{GCP: block()}}},
			&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "gcp-echo"},
				Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{GCP: echo}}},
			&clusterv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "gcp-legacy"},
				Spec: clusterv1alpha1.ProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{GCP: block()}}},
		},
		Timeout: 45 * time.Second,
		Logs:    logs,
	})
	return &env{Env: e, srv: srv, gets: gets, key: key, upstream: upstream}
}

// listen plays the proxy of mr answering on ip:port once the fake handed
// out ip: a real TCP listener answering as Squid with mr's configuration
// does, so the readiness probe is the production one.
func listen(t *testing.T, ip string, port int32, mr resource.Managed) {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
	if err != nil {
		t.Fatalf("listen on %s:%d: %v", ip, port, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go squid.AnswerProbes(l, squid.Identity(string(mr.GetUID())))
}

func nsProxy(name string, port int32, mutate ...func(*nsproxy.GCPProxy)) *nsproxy.GCPProxy {
	p := &nsproxy.GCPProxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a"},
		Spec: nsproxy.GCPProxySpec{
			ManagedResourceSpec: providerenv.ManagedSpec("gcp-prod", name+"-conn"),
			ForProvider: spec.GCPProxyParameters{
				Zone: zone, MachineType: "small", Image: "ubuntu-2404",
				Proxy: spec.ProxySettings{Port: &port, AllowedClientCIDRs: []string{"10.20.0.0/16"}, Auth: &spec.ProxyAuth{Enabled: true}},
			},
		},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func TestGCPProxyIntegration(t *testing.T) {
	e := start(t, controlplane.Options{})
	ctx := context.Background()

	t.Run("StaticAddressAndFirewallLifecycle", func(t *testing.T) {
		port := testenv.FreePort(t)
		p := nsProxy("payments", port, func(p *nsproxy.GCPProxy) {
			p.Spec.ForProvider.Address = &spec.GCPAddress{Type: "Static"}
			p.Spec.ForProvider.Firewall = &spec.GCPFirewall{Manage: true}
		})
		e.srv.ResetRequests()
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the external name", 30*time.Second, func() (bool, string) {
			_ = e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
			return meta.GetExternalName(p) != "", ""
		})
		name := meta.GetExternalName(p)

		// The address is reserved before the instance, and becomes its
		// NAT IP; the proxy answers there once the instance runs.
		var staticIP string
		testenv.WaitFor(t, "the static address to be reserved", 30*time.Second, func() (bool, string) {
			a, ok := e.srv.Address(region, name)
			staticIP, _ = a["address"].(string)
			return ok && staticIP != "", fmt.Sprint(e.srv.Names())
		})
		listen(t, staticIP, port, p)
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
		e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionTrue, "")
		obs := p.Status.AtProvider
		if obs.State != "Running" || obs.IP != staticIP || obs.EgressIP != staticIP || !obs.ProxyReachable ||
			obs.ID != "zones/"+zone+"/instances/"+name || obs.Placement == nil || obs.Placement.Zone != zone || obs.CreatedAt == nil {
			t.Errorf("status.atProvider = %+v; want Running at the static address %s", obs, staticIP)
		}
		inst, _ := e.srv.Instance(zone, name)
		labels, _ := inst["labels"].(map[string]any)
		if labels["egressproxy-uid"] != string(p.GetUID()) || labels["egressproxy-installation"] != testInstallation {
			t.Errorf("instance labels %v; want the ownership mark", labels)
		}
		fw, ok := e.srv.Firewall(name)
		if !ok {
			t.Fatalf("no firewall rule %s: %v", name, e.srv.Names())
		}
		// The rule targets the proxy's own tag (egressproxy- and a
		// digest), which the instance carries; never its name.
		tags := fmt.Sprint(inst["tags"])
		target, _ := fw["targetTags"].([]any)
		if len(target) != 1 || !strings.HasPrefix(fmt.Sprint(target[0]), gcpbackend.TagPrefix) || fmt.Sprint(target[0]) == name || !strings.Contains(tags, fmt.Sprint(target[0])) {
			t.Errorf("firewall rule targets %v, instance tags %v; want the proxy's own egressproxy- tag on both", fw["targetTags"], tags)
		}
		if fmt.Sprint(fw["sourceRanges"]) != "[10.20.0.0/16]" ||
			!strings.Contains(fmt.Sprint(fw["allowed"]), fmt.Sprint(port)) {
			t.Errorf("firewall rule = sourceRanges %v targetTags %v allowed %v", fw["sourceRanges"], fw["targetTags"], fw["allowed"])
		}
		conn := &corev1.Secret{}
		testenv.WaitFor(t, "the connection secret", 30*time.Second, func() (bool, string) {
			err := e.Kube.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "payments-conn"}, conn)
			return err == nil && string(conn.Data["host"]) == staticIP, fmt.Sprint(err)
		})
		if u := string(conn.Data["url"]); !strings.HasPrefix(u, "http://proxy:") || !strings.HasSuffix(u, fmt.Sprintf("@%s:%d", staticIP, port)) {
			t.Errorf("url = %q", u)
		}
		// What a vendor's allow-list needs, and what envFrom needs.
		if got := string(conn.Data["egressIP"]); got != staticIP {
			t.Errorf("connection Secret egressIP = %q; want the static address %s", got, staticIP)
		}
		if string(conn.Data["HTTPS_PROXY"]) != string(conn.Data["url"]) || string(conn.Data["endpoint"]) != fmt.Sprintf("%s:%d", staticIP, port) {
			t.Errorf("connection Secret HTTPS_PROXY is the url: %v; endpoint %q", string(conn.Data["HTTPS_PROXY"]) == string(conn.Data["url"]), conn.Data["endpoint"])
		}
		t.Logf("API requests to become Ready: %d", len(e.srv.Requests()))

		t.Run("AtMostOneRequestPerObserveAtSteadyState", func(t *testing.T) {
			healthCheck := regexp.MustCompile(`^GET regions/[a-z0-9-]+([?].*)?$`)
			// A steady proxy is observed from the installation's aggregated
			// listing, shared by the config's steady proxies
			// (internal/backend/gcp/batch.go): at most one request per
			// Observe, fewer when polls share one listing.
			time.Sleep(500 * time.Millisecond) // let in-flight reconciles end
			e.srv.ResetRequests()
			before := e.gets.Load()
			time.Sleep(4 * time.Second)
			reqs := e.srv.Requests()
			observes := e.gets.Load() - before
			if observes == 0 {
				t.Fatal("no Observe in 4 s; the poll interval is 1 s")
			}
			var observeReqs []string
			for _, r := range reqs {
				switch {
				case healthCheck.MatchString(r):
					// The config's health check (regions.get), on its own
					// interval.
				case strings.HasPrefix(r, "GET zones/"+zone+"/instances/"), strings.HasPrefix(r, "GET aggregated/instances"):
					observeReqs = append(observeReqs, r)
				default:
					t.Errorf("request at steady state that is neither instances.get nor the aggregated listing: %s", r)
				}
			}
			t.Logf("steady state: %d Observes, %d API requests: %.2f requests per Observe", observes, len(observeReqs), float64(len(observeReqs))/float64(observes))
			// One more than the Observes counted: an Observe counted just
			// before the window may send its request just inside it.
			if len(observeReqs) > int(observes)+1 || len(observeReqs) == 0 {
				t.Errorf("%d API requests for %d Observes; want at least one and at most one each", len(observeReqs), observes)
			}
		})

		t.Run("ChangingTheClientCIDRsPatchesTheRuleAndRestartsSquid", func(t *testing.T) {
			e.Update(t, p, func() { p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"10.30.0.0/16", "192.168.0.0/24"} })
			testenv.WaitFor(t, "the rule to admit the new CIDRs", 30*time.Second, func() (bool, string) {
				fw, _ := e.srv.Firewall(name)
				return fmt.Sprint(fw["sourceRanges"]) == "[10.30.0.0/16 192.168.0.0/24]", fmt.Sprint(fw["sourceRanges"])
			})
			testenv.WaitFor(t, "the new squid.conf in metadata", 30*time.Second, func() (bool, string) {
				inst, _ := e.srv.Instance(zone, name)
				return strings.Contains(fmt.Sprint(inst["metadata"]), "acl clients src 10.30.0.0/16 192.168.0.0/24"), ""
			})
			e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
			if !slices.ContainsFunc(e.srv.Requests(), func(r string) bool {
				return strings.HasPrefix(r, "PUT zones/"+zone+"/instances/"+name+"?") && strings.Contains(r, "minimalAction=RESTART")
			}) {
				t.Errorf("no instances.update with minimalAction=RESTART among %v", e.srv.Requests())
			}
		})

		t.Run("DeletingRemovesInstanceAddressAndRule", func(t *testing.T) {
			e.srv.ResetRequests()
			if err := e.Kube.Delete(ctx, p); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, "the resource to be gone", 45*time.Second, func() (bool, string) {
				err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
				return kerrors.IsNotFound(err), fmt.Sprintf("%v; backend %v; conditions %+v", err, e.srv.Names(), p.Status.Conditions)
			})
			for _, n := range e.srv.Names() {
				if strings.HasSuffix(n, name) {
					t.Errorf("%s remains after its proxy was deleted", n)
				}
			}
			reqs := e.srv.Requests()
			var order []string
			for _, r := range reqs {
				rest, ok := strings.CutPrefix(r, "DELETE ")
				if !ok {
					continue
				}
				p := strings.Split(rest, "/")
				kind := p[len(p)-2]
				if len(order) == 0 || order[len(order)-1] != kind {
					order = append(order, kind)
				}
			}
			if want := []string{"instances", "addresses", "firewalls"}; !slices.Equal(order, want) {
				t.Errorf("deletions in the order %v; want %v", order, want)
			}
			t.Logf("API requests to delete: %d: %v", len(reqs), reqs)
		})
	})

	// The egress check through a real Squid on the instance's static
	// address: the echo endpoint sees this machine's address, not the
	// reserved one, and the proxy says so (Differs), publishing what the
	// vendor would see.
	t.Run("StaticAddressTheEchoDoesNotSeeDiffers", func(t *testing.T) {
		e.srv.RunSquid(providerenv.RequireSquid(t))
		defer e.srv.RunSquid("")
		port := testenv.FreePort(t)
		p := nsProxy("verified", port, func(p *nsproxy.GCPProxy) {
			p.Spec.ProviderConfigReference.Name = "gcp-echo"
			p.Spec.ForProvider.Address = &spec.GCPAddress{Type: "Static"}
		})
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, spec.TypeEgressVerified, corev1.ConditionFalse, "but the backend says")
		seen := testenv.EchoFromHere(t, testenv.EchoURL(e.upstream))
		o := p.Status.AtProvider
		if c.Reason != "Differs" || o.EgressIP != seen || o.EgressIP == o.IP || o.EgressIPSource != spec.EgressIPVerified || !strings.Contains(c.Message, o.IP) {
			t.Errorf("EgressVerified %s %q, egressIP %q (%s), static %s; want Differs naming the static address, and %s, what the echo saw", c.Reason, c.Message, o.EgressIP, o.EgressIPSource, o.IP, seen)
		}
		e.WaitEvent(t, "team-a", p.Name, corev1.EventTypeWarning, "EgressIPDiffers", "")
		conn := &corev1.Secret{}
		if err := e.Kube.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "verified-conn"}, conn); err != nil || string(conn.Data["egressIP"]) != seen {
			t.Errorf("connection Secret egressIP %q, %v; want %s", conn.Data["egressIP"], err, seen)
		}
		if err := e.Kube.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the resource to be gone", 45*time.Second, func() (bool, string) {
			err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
			return kerrors.IsNotFound(err), fmt.Sprint(err)
		})
	})

	t.Run("TLSOnTheExternalAddress", func(t *testing.T) { tlsOnTheExternalAddress(t, e) })
	// A firewall that admits only the clients keeps the provider's probe
	// and check out: the guest checks through its own Squid (its
	// cloud-init's script, run by the fake's guest on its real Squid) and
	// puts the line to its guest attribute, which the driver reads with
	// instances.getGuestAttributes. The proxy is Ready on that word. The
	// echo saw this machine's address, not the instance's external one:
	// the guest's word does not stand against the backend's figure, so
	// the condition says Differs, naming both, and the external address
	// stays published.
	t.Run("UnreachableProxyReportsFromTheGuest", func(t *testing.T) {
		e.srv.RunSquid(providerenv.RequireSquid(t))
		defer e.srv.RunSquid("")
		e.srv.EnforceFirewall("127.0.0.1")
		defer e.srv.EnforceFirewall("")
		port := testenv.FreePort(t)
		p := nsProxy("reported", port, func(p *nsproxy.GCPProxy) {
			p.Spec.ProviderConfigReference.Name = "gcp-echo"
		})
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, spec.TypeEgressVerified, corev1.ConditionFalse, "but the backend says")
		seen := testenv.EchoFromHere(t, testenv.EchoURL(e.upstream))
		o := p.Status.AtProvider
		if c.Reason != "Differs" || !strings.Contains(c.Message, "saw "+seen) || !strings.Contains(c.Message, "the backend says the instance's address is "+o.IP) ||
			o.IP == "" || o.IP == seen || o.EgressIP != o.IP || o.EgressIPSource != spec.EgressIPBackend || o.EgressIPVerifiedAt != nil {
			t.Errorf("EgressVerified %s %q, egressIP %q (%s, at %v), external %s; want Differs naming %s (what the echo saw) and the external address, which stays published (Backend)",
				c.Reason, c.Message, o.EgressIP, o.EgressIPSource, o.EgressIPVerifiedAt, o.IP, seen)
		}
		e.WaitEvent(t, "team-a", p.Name, corev1.EventTypeWarning, "EgressIPDiffers", "")
		if r := p.GetCondition(xpv2.TypeReady); r.Status != corev1.ConditionTrue {
			t.Errorf("Ready %s %q; want True on the guest's own check", r.Status, r.Message)
		}
		if err := e.Kube.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the resource to be gone", 45*time.Second, func() (bool, string) {
			err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
			return kerrors.IsNotFound(err), fmt.Sprint(err)
		})
	})

	t.Run("AsynchronousFailureReachesTheCondition", func(t *testing.T) {
		// Accepted, then failed: the stockout arrives on the operation.
		e.srv.FailNextOperation("instances", "insert", "ZONE_RESOURCE_POOL_EXHAUSTED",
			"The zone 'projects/"+project+"/zones/"+zone+"' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.", 503)
		p := nsProxy("stockout", testenv.FreePort(t))
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse, "ZONE_RESOURCE_POOL_EXHAUSTED")
		if !strings.Contains(c.Message, "out of quota or capacity on the backend") || !strings.Contains(c.Message, "ClusterProviderConfig gcp-prod") {
			t.Errorf("condition %q: want the quota class and the config's name", c.Message)
		}
		t.Logf("Synced=False: %s", c.Message)
		if p.Status.AtProvider.Operation == "" {
			t.Errorf("status.atProvider.operation is empty; the failed insert's operation should be kept while it is reported")
		}
		if err := e.Kube.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("SynchronousQuotaErrorReachesTheCondition", func(t *testing.T) {
		for range 20 {
			e.srv.FailNext("POST", "zones/"+zone+"/instances", 403, "quotaExceeded", "Quota 'CPUS' exceeded.  Limit: 24.0 in region europe-west1.")
		}
		p := nsProxy("quota", testenv.FreePort(t), func(p *nsproxy.GCPProxy) { p.Spec.ForProvider.Firewall = &spec.GCPFirewall{Manage: false} })
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse, "quotaExceeded")
		e.srv.ClearFailures()
		if !strings.Contains(c.Message, "out of quota or capacity") {
			t.Errorf("condition %q: want the quota class", c.Message)
		}
		if err := e.Kube.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ClusterScopedProxyWithLegacyConfig", func(t *testing.T) {
		port := testenv.FreePort(t)
		p := &clusterproxy.GCPProxy{
			ObjectMeta: metav1.ObjectMeta{Name: "shared"},
			Spec: clusterproxy.GCPProxySpec{
				ClusterManagedResourceSpec: providerenv.ClusterManagedSpec("gcp-legacy", "shared-conn"),
				ForProvider:                spec.GCPProxyParameters{Proxy: spec.ProxySettings{Port: &port, AllowedClientCIDRs: []string{"10.0.0.0/8"}}},
			},
		}
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		var ip string
		testenv.WaitFor(t, "an ephemeral NAT IP", 30*time.Second, func() (bool, string) {
			_ = e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
			inst, ok := e.srv.Instance(zone, meta.GetExternalName(p))
			if !ok {
				return false, "no instance"
			}
			ip = natIP(inst)
			return ip != "", fmt.Sprint(inst["status"])
		})
		listen(t, ip, port, p)
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
		if p.Status.AtProvider.EgressIP != ip {
			t.Errorf("egressIP %q, want the ephemeral NAT IP %q", p.Status.AtProvider.EgressIP, ip)
		}
		if err := e.Kube.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the cluster-scoped resource to be gone", 45*time.Second, func() (bool, string) {
			return kerrors.IsNotFound(e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)), fmt.Sprint(e.srv.Names())
		})
	})

	t.Run("ConfigHealthReportsTheProjectAndQuota", func(t *testing.T) {
		pc := &nsv1alpha1.ClusterProviderConfig{}
		testenv.WaitFor(t, "Healthy=True on the config", 30*time.Second, func() (bool, string) {
			_ = e.Kube.Get(ctx, types.NamespacedName{Name: "gcp-prod"}, pc)
			c := pc.GetCondition(health.TypeHealthy)
			return c.Status == corev1.ConditionTrue && len(pc.Status.Targets) == 1, c.Message
		})
		tg := pc.Status.Targets[0]
		if tg.Target != "projects/"+project || tg.Details["quota."+region+".CPUS"] == "" {
			t.Errorf("target %+v; want the project with quota details", tg)
		}
	})

	t.Run("TheKeyNeverLeaks", func(t *testing.T) {
		if strings.Contains(e.Logs.String(), keySentinel) {
			t.Error("the service-account key appears in the provider's log")
		}
		for _, l := range []client.ObjectList{&nsproxy.GCPProxyList{}, &clusterproxy.GCPProxyList{}, &corev1.EventList{}} {
			if err := e.Kube.List(ctx, l); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(fmt.Sprintf("%+v", l), keySentinel) {
				t.Errorf("the service-account key appears in a %T", l)
			}
		}
	})
}

func natIP(inst map[string]any) string {
	nics, _ := inst["networkInterfaces"].([]any)
	for _, n := range nics {
		acs, _ := n.(map[string]any)["accessConfigs"].([]any)
		for _, ac := range acs {
			if ip, _ := ac.(map[string]any)["natIP"].(string); ip != "" {
				return ip
			}
		}
	}
	return ""
}
