package proxmox_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	backend "github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	proxmoxctl "github.com/egressproxy/provider-egressproxy/internal/controller/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/health"
	"github.com/egressproxy/provider-egressproxy/internal/testenv"
)

const testInstallation = "pve-it"

// env is a real control plane running the ProxmoxProxy controllers of both
// scopes in-process, with the production binding (Secrets read on every
// Connect, the production client and driver), against a fake Proxmox VE
// cluster whose guests open real listeners the readiness probe dials.
type env struct {
	kube client.Client
	fake *pvetest.Server
}

func start(t *testing.T) *env {
	t.Helper()
	fake := pvetest.New(t, pvetest.Options{Listen: true})
	cp, s := testenv.Start(t, controlplane.Options{})
	ctrl.SetLogger(logr.Discard())
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{Scheme: s, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	features := &feature.Flags{}
	features.Enable(feature.EnableBetaManagementPolicies)
	log := logging.NewNopLogger()
	if os.Getenv("EGRESSPROXY_TEST_LOG") != "" {
		log = logging.NewLogrLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr)))
	}
	o := external.Options{
		Options: controller.Options{
			Logger: log, GlobalRateLimiter: ratelimiter.NewGlobal(100), PollInterval: 400 * time.Millisecond,
			MaxConcurrentReconciles: 4, Features: features,
		},
		InstallationID: testInstallation, Namespace: "crossplane-system", NotReadyPollInterval: 200 * time.Millisecond,
	}
	// The production binding, with a failed task retried after seconds
	// rather than a minute.
	kind := proxmoxctl.New(mgr, proxmoxctl.Options{Driver: func(o *backend.Options) {
		o.RetryFailedTaskAfter = 3 * time.Second
	}})
	if err := external.Setup(mgr, o, external.NewShared(mgr, o), kind); err != nil {
		t.Fatal(err)
	}
	if err := health.Setup(mgr, health.Reconciler{
		Kube:     mgr.GetClient(),
		Configs:  external.ConfigReader{Kube: mgr.GetClient(), SecretReader: mgr.GetAPIReader(), InstallationID: testInstallation, Backends: []external.Backend{kind.Backend}},
		Interval: time.Hour, Timeout: 10 * time.Second,
	}, logging.NewNopLogger(), nsv1alpha1.ClusterProviderConfigGroupVersionKind); err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cp.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{"crossplane-system", "team-a"} {
		if err := kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	block := func() *spec.ProxmoxConfig {
		vlan := int32(20)
		return &spec.ProxmoxConfig{
			URL: fake.URL,
			Credentials: spec.ProxmoxCredentials{
				TokenSecretRef: spec.SecretKeySelector{Namespace: "crossplane-system", Name: "pve", Key: "token"},
				CASecretRef:    &spec.SecretKeySelector{Namespace: "crossplane-system", Name: "pve", Key: "ca.pem"},
			},
			Nodes:        []string{"pve1", "pve2"},
			ISOStorage:   "local",
			Bridge:       "vmbr0",
			VLANTag:      &vlan,
			VMIDRange:    &spec.VMIDRange{Min: 100000, Max: 199999},
			DiskGiB:      10,
			Templates:    map[string]spec.ProxmoxTemplate{"debian-12": {VMID: 9000}},
			MachineTypes: map[string]spec.ProxmoxMachineType{"small": {Cores: 1, MemoryMiB: 1024}},
		}
	}
	for _, obj := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pve", Namespace: "crossplane-system"},
			Data: map[string][]byte{"token": []byte(fake.Token()), "ca.pem": fake.CAPEM()}},
		&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-pve"},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: block()}}},
		&clusterv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-pve"},
			Spec: clusterv1alpha1.ProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: block()}}},
	} {
		if err := kube.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	return &env{kube: kube, fake: fake}
}

func waitReady(t *testing.T, kube client.Client, mg resource.Managed) {
	t.Helper()
	testenv.WaitFor(t, mg.GetName()+" to be Ready", 60*time.Second, func() (bool, string) {
		if err := kube.Get(context.Background(), client.ObjectKeyFromObject(mg), mg); err != nil {
			return false, err.Error()
		}
		r, s := mg.GetCondition(xpv2.TypeReady), mg.GetCondition(xpv2.TypeSynced)
		return r.Status == corev1.ConditionTrue && s.Status == corev1.ConditionTrue,
			fmt.Sprintf("Ready=%s %q, Synced=%s %q", r.Status, r.Message, s.Status, s.Message)
	})
}

func waitGone(t *testing.T, kube client.Client, mg resource.Managed) {
	t.Helper()
	testenv.WaitFor(t, mg.GetName()+" to be gone", 60*time.Second, func() (bool, string) {
		err := kube.Get(context.Background(), client.ObjectKeyFromObject(mg), mg)
		if kerrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		r, s := mg.GetCondition(xpv2.TypeReady), mg.GetCondition(xpv2.TypeSynced)
		return false, fmt.Sprintf("Ready=%s %q, Synced=%s %q", r.Status, r.Message, s.Status, s.Message)
	})
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
			ManagedResourceSpec: xpv2.ManagedResourceSpec{ProviderConfigReference: &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "home-pve"}},
			ForProvider:         spec.ProxmoxProxyParameters{Node: "pve1", Proxy: proxySettings()},
		},
	}
	if err := e.kube.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the clone's failure on the Synced condition", 30*time.Second, func() (bool, string) {
		if err := e.kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err.Error()
		}
		c := p.GetCondition(xpv2.TypeSynced)
		return c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "storage 'local-lvm' is full") &&
			strings.Contains(c.Message, "insufficient free space"), c.Message
	})
	waitReady(t, e.kube, p)
	if err := e.kube.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e.kube, p)
}

// configHealth: the health controller reports each node of the config.
func configHealth(t *testing.T, e *env) {
	pc := &nsv1alpha1.ClusterProviderConfig{}
	testenv.WaitFor(t, "the config's health", 30*time.Second, func() (bool, string) {
		if err := e.kube.Get(context.Background(), types.NamespacedName{Name: "home-pve"}, pc); err != nil {
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
			ManagedResourceSpec: xpv2.ManagedResourceSpec{
				ProviderConfigReference:          &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "home-pve"},
				WriteConnectionSecretToReference: &xpv2.LocalSecretReference{Name: "payments-proxy"},
			},
			ForProvider: spec.ProxmoxProxyParameters{Node: "pve1", MachineType: "small", Image: "debian-12",
				CloudInit: "#cloud-config\ntimezone: Europe/Prague\n", Proxy: proxySettings()},
		},
	}
	cl := &clusterproxy.ProxmoxProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "shared-egress"},
		Spec: clusterproxy.ProxmoxProxySpec{
			ClusterManagedResourceSpec: xpv2.ClusterManagedResourceSpec{
				ProviderConfigReference:          &xpv2.Reference{Name: "home-pve"},
				WriteConnectionSecretToReference: &xpv2.SecretReference{Namespace: "crossplane-system", Name: "shared-egress-proxy"},
			},
			ForProvider: spec.ProxmoxProxyParameters{Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.30.0.0/16"}}, Node: "pve1"},
		},
	}
	start := time.Now()
	for _, mg := range []client.Object{ns, cl} {
		if err := e.kube.Create(ctx, mg); err != nil {
			t.Fatal(err)
		}
	}
	waitReady(t, e.kube, ns)
	waitReady(t, e.kube, cl)
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
		if err := e.kube.Get(ctx, c.secret, sec); err != nil {
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
		e.fake.ResetRequests()
		time.Sleep(3 * time.Second)
		reqs := e.fake.Requests()
		lists := 0
		for _, r := range reqs {
			switch {
			case r.Endpoint == "GET /cluster/resources" && r.Params["type"] == "vm":
				lists++
			default:
				t.Errorf("request at steady state besides the shared list: %s %s %v", r.Method, r.Path, r.Params)
			}
		}
		if lists < 4 {
			t.Errorf("%d lists in 3 s of polling two proxies every 400 ms; want at least 4: polls must not answer from their previous poll's data", lists)
		}
		t.Logf("steady state: 2 proxies polled for 3s, %d requests", len(reqs))
	})

	t.Run("ChangedProxyBlockIsAppliedByReboot", func(t *testing.T) {
		before := vmNamed(t, e.fake, meta.GetExternalName(ns))
		e.fake.ResetRequests()
		if err := e.kube.Get(ctx, client.ObjectKeyFromObject(ns), ns); err != nil {
			t.Fatal(err)
		}
		ns.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"192.168.0.0/16"}
		if err := e.kube.Update(ctx, ns); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the VM to reboot onto the new seed", 60*time.Second, func() (bool, string) {
			vm := vmNamed(t, e.fake, meta.GetExternalName(ns))
			return vm.Boots == before.Boots+1 && !strings.Contains(vm.Description, "applying") && vm.Tags != before.Tags,
				fmt.Sprintf("boots %d, tags %q", vm.Boots, vm.Tags)
		})
		waitReady(t, e.kube, ns)
		t.Logf("update applied with %d API requests", len(e.fake.Requests()))
	})

	t.Run("DeletionLeavesNothing", func(t *testing.T) {
		e.fake.ResetRequests()
		for _, mg := range []client.Object{ns, cl} {
			if err := e.kube.Delete(ctx, mg); err != nil {
				t.Fatal(err)
			}
		}
		waitGone(t, e.kube, ns)
		waitGone(t, e.kube, cl)
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
				ManagedResourceSpec: xpv2.ManagedResourceSpec{ProviderConfigReference: &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "home-pve"}},
				ForProvider:         spec.ProxmoxProxyParameters{Node: "pve1", Proxy: proxySettings()},
			},
		}
		mutate(p)
		return p
	}
	waitSynced := func(p *nsproxy.ProxmoxProxy, says string) {
		t.Helper()
		testenv.WaitFor(t, p.Name+" Synced=False saying "+says, 30*time.Second, func() (bool, string) {
			if err := e.kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return false, err.Error()
			}
			c := p.GetCondition(xpv2.TypeSynced)
			return c.Status == corev1.ConditionFalse && strings.Contains(c.Message, says), c.Message
		})
	}
	unknown := mk("unknown-type", func(p *nsproxy.ProxmoxProxy) { p.Spec.ForProvider.MachineType = "huge" })
	if err := e.kube.Create(ctx, unknown); err != nil {
		t.Fatal(err)
	}
	waitSynced(unknown, `spec.forProvider.machineType: "huge" is not in ClusterProviderConfig home-pve`)

	// A config whose token Secret is missing.
	pc := &nsv1alpha1.ClusterProviderConfig{}
	if err := e.kube.Get(ctx, types.NamespacedName{Name: "home-pve"}, pc); err != nil {
		t.Fatal(err)
	}
	broken := pc.DeepCopy()
	broken.ObjectMeta = metav1.ObjectMeta{Name: "no-token"}
	broken.Spec.Proxmox.Credentials.TokenSecretRef.Name = "missing"
	if err := e.kube.Create(ctx, broken); err != nil {
		t.Fatal(err)
	}
	noToken := mk("no-token", func(p *nsproxy.ProxmoxProxy) { p.Spec.ProviderConfigReference.Name = "no-token" })
	if err := e.kube.Create(ctx, noToken); err != nil {
		t.Fatal(err)
	}
	waitSynced(noToken, "spec.proxmox.credentials.tokenSecretRef: Secret crossplane-system/missing does not exist")

	// A template VMID that is a plain VM.
	vmid := e.fake.AddVM(pvetest.VMSpec{Name: "not-a-template"})
	wrong := pc.DeepCopy()
	wrong.ObjectMeta = metav1.ObjectMeta{Name: "wrong-template"}
	wrong.Spec.Proxmox.Templates = map[string]spec.ProxmoxTemplate{"debian-12": {VMID: int32(vmid)}}
	if err := e.kube.Create(ctx, wrong); err != nil {
		t.Fatal(err)
	}
	notTmpl := mk("not-a-template", func(p *nsproxy.ProxmoxProxy) { p.Spec.ProviderConfigReference.Name = "wrong-template" })
	if err := e.kube.Create(ctx, notTmpl); err != nil {
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
