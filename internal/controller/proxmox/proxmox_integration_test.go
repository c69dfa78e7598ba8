package proxmox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
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
	backend "github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/health"
	proxmoxctl "github.com/egressproxy/provider-egressproxy/internal/controller/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
)

const testInstallation = "pve-it"

// env is a real control plane running the ProxmoxProxy controllers of both
// scopes in-process, with the production binding (Secrets read on every
// Connect, the production client and driver), against a fake Proxmox VE
// cluster whose guests open real listeners the readiness probe dials.
type env struct {
	*providerenv.Env
	fake *pvetest.Server
	// upstream is a test host's server, the echo endpoint of the config
	// home-pve-echo.
	upstream string
}

func start(t *testing.T) *env {
	t.Helper()
	// The guests run real Squid from their seeds: requests through them
	// go out to the upstream.
	fake := pvetest.New(t, pvetest.Options{Listen: true, Squid: providerenv.RequireSquid(t)})
	upstream, _ := testenv.Upstream(t)
	block := func() *spec.ProxmoxConfig {
		b := fake.ProviderConfig("crossplane-system", "pve")
		b.VLANTag = ptr.To[int32](20)
		return b
	}
	echo := block()
	echo.EgressCheck = &spec.EgressCheck{URL: testenv.EchoURL(upstream)}
	e := providerenv.Start(t, providerenv.Options{
		// The production binding, with a failed task retried after seconds
		// rather than a minute.
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			return []external.Binding{proxmoxctl.New(mgr, proxmoxctl.Options{Driver: func(o *backend.Options) {
				o.RetryFailedTaskAfter = 3 * time.Second
			}})}
		},
		InstallationID: testInstallation, PollInterval: 400 * time.Millisecond, NotReadyPollInterval: 200 * time.Millisecond,
		Health:     pcontroller.HealthOptions{Interval: time.Hour},
		Namespaces: []string{"team-a"},
		Objects: []client.Object{
			fake.Secret("crossplane-system", "pve"),
			// The namespaced proxy of lifecycle brings its own cloud-init.
			&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-pve"},
				Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: func() *spec.ProxmoxConfig {
					b := block()
					b.AllowTenantCloudInit = true
					return b
				}()}}},
			&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-pve-echo"},
				Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: echo}}},
			&clusterv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-pve"},
				Spec: clusterv1alpha1.ProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: block()}}},
		},
		Timeout: 60 * time.Second,
	})
	return &env{Env: e, fake: fake, upstream: upstream}
}

func proxySettings() spec.ProxySettings {
	return spec.ProxySettings{AllowedClientCIDRs: []string{"10.20.0.0/16"}, Auth: &spec.ProxyAuth{Enabled: true}}
}

// TestProxmoxIntegration runs the ProxmoxProxy controllers on one control
// plane (controller names are unique per process) against the fake.
func TestProxmoxIntegration(t *testing.T) {
	e := start(t)
	t.Run("Lifecycle", func(t *testing.T) { lifecycle(t, e) })
	t.Run("ConfigProblems", func(t *testing.T) { configProblems(t, e) })
	t.Run("FailedCloneShowsOnTheCondition", func(t *testing.T) { failedClone(t, e) })
	t.Run("HealthOfTheConfig", func(t *testing.T) { configHealth(t, e) })
	t.Run("EgressAddressVerifiedThroughTheProxy", func(t *testing.T) { egressVerified(t, e) })
	t.Run("TLSToTheProxy", func(t *testing.T) { tlsToTheProxy(t, e) })
}

// egressVerified: a guest's real Squid, its clients elsewhere, takes the
// provider's egress check to the echo endpoint, and the address published
// is the one the upstream sees of this machine, where the guest's Squid
// runs: not the guest's own address.
func egressVerified(t *testing.T, e *env) {
	ctx := context.Background()
	p := &nsproxy.ProxmoxProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "verified", Namespace: "team-a"},
		Spec: nsproxy.ProxmoxProxySpec{
			ManagedResourceSpec: providerenv.ManagedSpec("home-pve-echo", "verified-proxy"),
			ForProvider:         spec.ProxmoxProxyParameters{Node: "pve1", Proxy: proxySettings()},
		},
	}
	if err := e.Kube.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	e.WaitReady(t, p)
	e.WaitForCondition(t, p, spec.TypeEgressVerified, corev1.ConditionTrue, "saw")
	// Directly, without a proxy: the guest's Squid runs on this machine.
	seen := testenv.EchoFromHere(t, testenv.EchoURL(e.upstream))
	o := p.Status.AtProvider
	sec := &corev1.Secret{}
	if err := e.Kube.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "verified-proxy"}, sec); err != nil {
		t.Fatal(err)
	}
	if o.EgressIP != seen || o.EgressIP == o.IP || o.EgressIPSource != spec.EgressIPVerified || o.EgressIPVerifiedAt == nil || string(sec.Data["egressIP"]) != seen {
		t.Errorf("egressIP %q (%s at %v), connection Secret %q, guest %s; want %s, what the upstream sees of this machine, Verified",
			o.EgressIP, o.EgressIPSource, o.EgressIPVerifiedAt, sec.Data["egressIP"], o.IP, seen)
	}
	if err := e.Kube.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	e.WaitGone(t, p)
}

// failedClone: a clone task that fails shows its exit status and the tail
// of its log on the resource's Synced condition, and is tried again.
func failedClone(t *testing.T, e *env) {
	ctx := context.Background()
	e.fake.FailNextTask("qmclone", "clone failed: storage 'local-lvm' is full",
		"create full clone of drive scsi0 (local-lvm:base-9000-disk-0)", "lvcreate 'pve/vm-100-disk-0' error:   Volume group \"pve\" has insufficient free space")
	p := &nsproxy.ProxmoxProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "clone-fails", Namespace: "team-a"},
		Spec: nsproxy.ProxmoxProxySpec{
			ManagedResourceSpec: providerenv.ManagedSpec("home-pve", ""),
			ForProvider:         spec.ProxmoxProxyParameters{Node: "pve1", Proxy: proxySettings()},
		},
	}
	if err := e.Kube.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the clone's failure on the Synced condition", 30*time.Second, func() (bool, string) {
		if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err.Error()
		}
		c := p.GetCondition(xpv2.TypeSynced)
		return c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "storage 'local-lvm' is full") &&
			strings.Contains(c.Message, "insufficient free space"), c.Message
	})
	e.WaitReady(t, p)
	if err := e.Kube.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	e.WaitGone(t, p)
}

// configHealth: the health controller reports each node of the config.
func configHealth(t *testing.T, e *env) {
	pc := &nsv1alpha1.ClusterProviderConfig{}
	testenv.WaitFor(t, "the config's health", 30*time.Second, func() (bool, string) {
		if err := e.Kube.Get(context.Background(), types.NamespacedName{Name: "home-pve"}, pc); err != nil {
			return false, err.Error()
		}
		st := pc.Status
		return pc.GetCondition(health.TypeHealthy).Status == corev1.ConditionTrue && len(st.Targets) == 2,
			fmt.Sprintf("%+v", st.Targets)
	})
	for _, tg := range pc.Status.Targets {
		if tg.Details["pveVersion"] == "" || tg.Details["tokenID"] != "egress@pve!provider" {
			t.Errorf("target %s: details %v", tg.Target, tg.Details)
		}
	}
}

// lifecycle runs a namespaced and a cluster-scoped ProxmoxProxy through
// their whole life on the real control plane: Ready with a reachable proxy
// and a connection Secret, an update of the proxy block applied by a
// reboot onto a new seed, and deletion leaving nothing on the cluster. It
// measures the API requests of each phase, and asserts that an Observe at
// steady state makes exactly two.
func lifecycle(t *testing.T, e *env) {
	ctx := context.Background()

	ns := &nsproxy.ProxmoxProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "payments", Namespace: "team-a"},
		Spec: nsproxy.ProxmoxProxySpec{
			ManagedResourceSpec: providerenv.ManagedSpec("home-pve", "payments-proxy"),
			ForProvider: spec.ProxmoxProxyParameters{Node: "pve1", MachineType: "small", Image: "debian-12",
				CloudInit: "#cloud-config\ntimezone: Europe/Prague\n", Proxy: proxySettings()},
		},
	}
	cl := &clusterproxy.ProxmoxProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "shared-egress"},
		Spec: clusterproxy.ProxmoxProxySpec{
			ClusterManagedResourceSpec: providerenv.ClusterManagedSpec("home-pve", "shared-egress-proxy"),
			ForProvider:                spec.ProxmoxProxyParameters{Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.30.0.0/16"}}, Node: "pve1"},
		},
	}
	start := time.Now()
	for _, mg := range []client.Object{ns, cl} {
		if err := e.Kube.Create(ctx, mg); err != nil {
			t.Fatal(err)
		}
	}
	e.WaitReady(t, ns)
	e.WaitReady(t, cl)
	created := e.fake.Requests()
	t.Logf("two proxies to Ready in %.1fs with %d API requests (%.1f per proxy)", time.Since(start).Seconds(), len(created), float64(len(created))/2)

	for _, c := range []struct {
		mg     resource.Managed
		obs    spec.ProxyObservation
		secret types.NamespacedName
		auth   bool
	}{
		{ns, ns.Status.AtProvider, types.NamespacedName{Namespace: "team-a", Name: "payments-proxy"}, true},
		{cl, cl.Status.AtProvider, types.NamespacedName{Namespace: "crossplane-system", Name: "shared-egress-proxy"}, false},
	} {
		name := meta.GetExternalName(c.mg)
		o := c.obs
		if o.State != "Running" || !o.ProxyReachable || !strings.HasPrefix(o.IP, "127.77.") || o.CreatedAt == nil ||
			o.Placement == nil || o.Placement.Node != "pve1" || !strings.HasSuffix(o.ID, "/"+name) || o.Details["vmid"] == "" {
			t.Errorf("%s: status.atProvider = %+v", c.mg.GetName(), o)
		}
		vm := vmNamed(t, e.fake, name)
		if !strings.Contains(vm.Tags, backend.TagUIDPrefix+string(c.mg.GetUID())) || !strings.Contains(vm.Tags, backend.TagInstallationPrefix+testInstallation) {
			t.Errorf("%s: VM tags %q; want the resource's mark", c.mg.GetName(), vm.Tags)
		}
		sec := &corev1.Secret{}
		if err := e.Kube.Get(ctx, c.secret, sec); err != nil {
			t.Fatalf("connection secret: %v", err)
		}
		wantURL := "http://" + o.IP + ":3128"
		if c.auth {
			wantURL = fmt.Sprintf("http://proxy:%s@%s:3128", sec.Data["password"], o.IP)
		}
		if string(sec.Data["url"]) != wantURL || string(sec.Data["host"]) != o.IP || string(sec.Data["port"]) != "3128" {
			t.Errorf("%s: connection secret url %q host %q port %q; want %s", c.mg.GetName(), sec.Data["url"], sec.Data["host"], sec.Data["port"], wantURL)
		}
	}
	if !strings.Contains(vmNamed(t, e.fake, meta.GetExternalName(ns)).Seed.UserData, "timezone: Europe/Prague") {
		t.Errorf("the user's cloudInit is not in the seed")
	}

	t.Run("SteadyStateObserveMakesOneRequestAtMost", func(t *testing.T) {
		// A steady VM is observed from a /cluster/resources snapshot shared
		// by the config's steady VMs, with the address its agent gave before
		// (internal/backend/proxmox/batch.go): no agent call, and at most
		// one list per Observe (fewer when polls of several proxies share
		// one).
		time.Sleep(500 * time.Millisecond) // let in-flight reconciles end
		e.fake.ResetRequests()
		start := time.Now()
		isList := func(r pvetest.Request) bool {
			return r.Endpoint == "GET /cluster/resources" && r.Params["type"] == "vm"
		}
		// Polls must not answer from their previous poll's data, so lists
		// keep coming, as fast as the machine's load lets them; the window
		// lasts a few seconds at least so that other requests would show.
		testenv.WaitFor(t, "at least 4 lists while polling two proxies every 400 ms", 30*time.Second, func() (bool, string) {
			n := 0
			for _, r := range e.fake.Requests() {
				if isList(r) {
					n++
				}
			}
			return n >= 4 && time.Since(start) >= 3*time.Second, fmt.Sprintf("%d lists", n)
		})
		reqs := e.fake.Requests()
		for _, r := range reqs {
			if !isList(r) {
				t.Errorf("request at steady state besides the shared list: %s %s %v", r.Method, r.Path, r.Params)
			}
		}
		t.Logf("steady state: 2 proxies polled for %.1fs, %d requests", time.Since(start).Seconds(), len(reqs))
	})

	t.Run("ChangedProxyBlockIsAppliedByReboot", func(t *testing.T) {
		before := vmNamed(t, e.fake, meta.GetExternalName(ns))
		e.fake.ResetRequests()
		e.Update(t, ns, func() { ns.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"192.168.0.0/16"} })
		testenv.WaitFor(t, "the VM to reboot onto the new seed", 60*time.Second, func() (bool, string) {
			vm := vmNamed(t, e.fake, meta.GetExternalName(ns))
			return vm.Boots == before.Boots+1 && !strings.Contains(vm.Description, "applying") && vm.Tags != before.Tags,
				fmt.Sprintf("boots %d, tags %q", vm.Boots, vm.Tags)
		})
		e.WaitReady(t, ns)
		t.Logf("update applied with %d API requests", len(e.fake.Requests()))
	})

	t.Run("DeletionLeavesNothing", func(t *testing.T) {
		e.fake.ResetRequests()
		for _, mg := range []client.Object{ns, cl} {
			if err := e.Kube.Delete(ctx, mg); err != nil {
				t.Fatal(err)
			}
		}
		e.WaitGone(t, ns)
		e.WaitGone(t, cl)
		t.Logf("two proxies deleted with %d API requests (%.1f per proxy)", len(e.fake.Requests()), float64(len(e.fake.Requests()))/2)
		e.fake.FinishTasks()
		for _, vm := range e.fake.VMs() {
			if !vm.Template() {
				t.Errorf("VM %d (%s) is left", vm.VMID, vm.Name)
			}
		}
		for _, v := range e.fake.Volumes() {
			t.Errorf("volume %s is left", v.VolID)
		}
	})
}

// configProblems: what admission cannot see shows on the resource's Synced
// condition, naming what to fix: an unknown catalogue key, a missing token
// Secret, a template that is not one.
func configProblems(t *testing.T, e *env) {
	ctx := context.Background()
	mk := func(name string, mutate func(*nsproxy.ProxmoxProxy)) *nsproxy.ProxmoxProxy {
		p := &nsproxy.ProxmoxProxy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a"},
			Spec: nsproxy.ProxmoxProxySpec{
				ManagedResourceSpec: providerenv.ManagedSpec("home-pve", ""),
				ForProvider:         spec.ProxmoxProxyParameters{Node: "pve1", Proxy: proxySettings()},
			},
		}
		mutate(p)
		return p
	}
	waitSynced := func(p *nsproxy.ProxmoxProxy, says string) {
		t.Helper()
		e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse, says)
	}
	unknown := mk("unknown-type", func(p *nsproxy.ProxmoxProxy) { p.Spec.ForProvider.MachineType = "huge" })
	if err := e.Kube.Create(ctx, unknown); err != nil {
		t.Fatal(err)
	}
	waitSynced(unknown, `spec.forProvider.machineType: "huge" is not in ClusterProviderConfig home-pve`)

	// A config whose token Secret is missing.
	pc := &nsv1alpha1.ClusterProviderConfig{}
	if err := e.Kube.Get(ctx, types.NamespacedName{Name: "home-pve"}, pc); err != nil {
		t.Fatal(err)
	}
	broken := pc.DeepCopy()
	broken.ObjectMeta = metav1.ObjectMeta{Name: "no-token"}
	broken.Spec.Proxmox.Credentials.TokenSecretRef.Name = "missing"
	if err := e.Kube.Create(ctx, broken); err != nil {
		t.Fatal(err)
	}
	noToken := mk("no-token", func(p *nsproxy.ProxmoxProxy) { p.Spec.ProviderConfigReference.Name = "no-token" })
	if err := e.Kube.Create(ctx, noToken); err != nil {
		t.Fatal(err)
	}
	waitSynced(noToken, "spec.proxmox.credentials.tokenSecretRef: Secret crossplane-system/missing does not exist")

	// A template VMID that is a plain VM.
	vmid := e.fake.AddVM(pvetest.VMSpec{Name: "not-a-template"})
	wrong := pc.DeepCopy()
	wrong.ObjectMeta = metav1.ObjectMeta{Name: "wrong-template"}
	wrong.Spec.Proxmox.Templates = map[string]spec.ProxmoxTemplate{"debian-12": {VMID: int32(vmid)}}
	if err := e.Kube.Create(ctx, wrong); err != nil {
		t.Fatal(err)
	}
	notTmpl := mk("not-a-template", func(p *nsproxy.ProxmoxProxy) { p.Spec.ProviderConfigReference.Name = "wrong-template" })
	if err := e.Kube.Create(ctx, notTmpl); err != nil {
		t.Fatal(err)
	}
	waitSynced(notTmpl, fmt.Sprintf("VM %d (template \"debian-12\") is not a template", vmid))
}

func vmNamed(t *testing.T, fake *pvetest.Server, name string) pvetest.VM {
	t.Helper()
	for _, vm := range fake.VMs() {
		if vm.Name == name {
			return vm
		}
	}
	t.Fatalf("no VM named %s", name)
	return pvetest.VM{}
}
