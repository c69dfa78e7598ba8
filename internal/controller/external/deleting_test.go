package external

import (
	"context"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/api/option"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	gcpbackend "github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// reconcilerManager is just enough of a manager for managed.NewReconciler.
type reconcilerManager struct {
	manager.Manager
	client client.Client
	scheme *runtime.Scheme
}

func (m reconcilerManager) GetClient() client.Client   { return m.client }
func (m reconcilerManager) GetScheme() *runtime.Scheme { return m.scheme }

// podKind is a PodProxy kind on the kubernetes block, whose Connect fails
// with connectErr (a credentials Secret that never existed).
func podKind(connectErr error) Kind[spec.PodProxyParameters] {
	return Kind[spec.PodProxyParameters]{
		Name:    "PodProxy",
		Proxy:   func(p *spec.PodProxyParameters) *spec.ProxySettings { return &p.Proxy },
		Request: func(*Config, *spec.PodProxyParameters, *proxy.Request) error { return nil },
		Backend: Backend{
			Name:    "kubernetes",
			Block:   func(s *spec.ProviderConfigSpec) (Block, bool) { return Block{}, s.Kubernetes != nil },
			Connect: func(context.Context, *Config) (proxy.Driver, error) { return nil, connectErr },
		},
	}
}

// reconcileDeleting runs crossplane-runtime's managed reconciler, as
// setupScope builds it, once over mg (being deleted, with the managed
// finalizer) in a fake API server holding configs, with c as its
// connector. It returns whether mg is still there, and its Synced message.
func reconcileDeleting[P any](t *testing.T, c *connector[P], gvk schema.GroupVersionKind, mg resource.Managed, configs ...client.Object) (bool, string) {
	t.Helper()
	s := testenv.Scheme(t)
	meta.AddFinalizer(mg, managed.FinalizerName)
	if len(mg.GetManagementPolicies()) == 0 {
		// As the API server defaults them (none is paused to the runtime).
		mg.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionAll})
	}
	kube := fake.NewClientBuilder().WithScheme(s).WithObjects(append(configs, mg)...).WithStatusSubresource(mg).Build()
	c.configs = ConfigReader{Kube: kube, SecretReader: kube, Backends: []Backend{c.kind.Backend}}
	c.kube = kube
	c.modern = resource.ModernTrackerFn(func(context.Context, resource.ModernManaged) error { return nil })
	c.passwords = &Passwords{key: []byte("k")}
	r := managed.NewReconciler(reconcilerManager{client: kube, scheme: s}, resource.ManagedKind(gvk),
		managed.WithExternalConnector(c),
		managed.WithInitializers(NameInitializer{Kube: kube}),
		managed.WithFinalizer(childrenFinalizer{Finalizer: resource.NewAPIFinalizer(kube, managed.FinalizerName), kube: kube}),
		managed.WithDeterministicExternalName(true),
		managed.WithCreationGracePeriod(0),
		managed.WithManagementPolicies(),
	)
	key := types.NamespacedName{Namespace: mg.GetNamespace(), Name: mg.GetName()}
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: key}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	got := mg.DeepCopyObject().(resource.Managed) //nolint:forcetypeassert // A copy of a managed resource.
	err := kube.Get(context.Background(), key, got)
	if kerrors.IsNotFound(err) {
		return false, ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return true, got.GetCondition(xpv2.TypeSynced).Message
}

// TestDeletingWithoutAnInstanceLetsGo: a resource being deleted whose
// config cannot be used (missing, another backend's block, a backend that
// cannot be connected to) and that never made an instance loses its
// finalizer through the real managed reconciler, so its namespace can go;
// one that carries a sign of an instance stays, saying why and the ways
// out.
func TestDeletingWithoutAnInstanceLetsGo(t *testing.T) {
	proxmoxConfig := &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home"},
		Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{}}}}
	kvmConfig := &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home"},
		Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}}}
	succeeded := func(cr *nsproxy.KVMProxy) { meta.SetExternalCreateSucceeded(cr, time.Now()) }
	failed := func(cr *nsproxy.KVMProxy) { meta.SetExternalCreateFailed(cr, time.Now()) }
	withID := func(cr *nsproxy.KVMProxy) { cr.Status.AtProvider.ID = "memory/" + testName }
	withOperation := func(cr *nsproxy.KVMProxy) { cr.Status.AtProvider.Operation = "op-1" }
	withPlacement := func(cr *nsproxy.KVMProxy) {
		cr.Status.AtProvider.Placement = &spec.Placement{Host: "h1", MachineType: "small", Image: "squid"}
	}
	noCreate := func(cr *nsproxy.KVMProxy) {
		cr.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionDelete})
	}
	connectFails := errors.New(`spec.kvm.credentials.secretRef: Secret "team-a/ssh" not found`)
	connectBusy := errors.Wrap(kerrors.NewServiceUnavailable("etcd is busy"), `spec.kvm.credentials.secretRef: cannot get Secret team-a/ssh`)
	deletedLongAgo := func(cr *nsproxy.KVMProxy) {
		t := metav1.NewTime(time.Now().Add(-connectGrace - time.Minute))
		cr.SetDeletionTimestamp(&t)
	}

	cases := map[string]struct {
		mods      []func(*nsproxy.KVMProxy)
		configs   []client.Object
		connect   error
		wantStays bool
	}{
		"MissingConfig":                  {},
		"AnotherBackendsBlock":           {configs: []client.Object{proxmoxConfig}},
		"BackendCannotConnect":           {configs: []client.Object{kvmConfig}, connect: connectFails},
		"MissingConfigCreateSucceeded":   {mods: []func(*nsproxy.KVMProxy){succeeded}, wantStays: true},
		"MissingConfigCreateFailed":      {mods: []func(*nsproxy.KVMProxy){failed}, wantStays: true},
		"MissingConfigWithID":            {mods: []func(*nsproxy.KVMProxy){withID}, wantStays: true},
		"MissingConfigWithOperation":     {mods: []func(*nsproxy.KVMProxy){withOperation}, wantStays: true},
		"MissingConfigWithPlacement":     {mods: []func(*nsproxy.KVMProxy){withPlacement}, wantStays: true},
		"AnotherBackendsBlockWithID":     {mods: []func(*nsproxy.KVMProxy){withID}, configs: []client.Object{proxmoxConfig}, wantStays: true},
		"BackendCannotConnectWithID":     {mods: []func(*nsproxy.KVMProxy){withID}, configs: []client.Object{kvmConfig}, connect: connectFails, wantStays: true},
		"NoCreatePolicyObservedAnImport": {mods: []func(*nsproxy.KVMProxy){noCreate, withID}},
		"NoCreatePolicyCreatedBefore":    {mods: []func(*nsproxy.KVMProxy){noCreate, succeeded}, wantStays: true},
		// A Connect error that may pass is waited out for a while: a crash
		// may have lost the annotations of a create.
		"BackendBusy":               {configs: []client.Object{kvmConfig}, connect: connectBusy, wantStays: true},
		"BackendBusyDeletedLongAgo": {mods: []func(*nsproxy.KVMProxy){deletedLongAgo}, configs: []client.Object{kvmConfig}, connect: connectBusy},
		// An earlier look (observeDeleting) set Deleting, then the config went.
		"MissingConfigAfterALook": {mods: []func(*nsproxy.KVMProxy){func(cr *nsproxy.KVMProxy) { cr.SetConditions(xpv2.Deleting()) }}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			k := testKind(nil)
			k.Backend.Connect = func(context.Context, *Config) (proxy.Driver, error) {
				if tc.connect != nil {
					return nil, tc.connect
				}
				return proxytest.NewMemory("memory", testInstallation), nil
			}
			c := &connector[spec.KVMProxyParameters]{kind: k}
			cr := proxyResource(append([]func(*nsproxy.KVMProxy){deleting, func(cr *nsproxy.KVMProxy) {
				cr.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "home"})
			}}, tc.mods...)...)
			stays, synced := reconcileDeleting(t, c, nsproxy.KVMProxyGroupVersionKind, cr, tc.configs...)
			if stays != tc.wantStays {
				t.Fatalf("resource still there: %v, want %v (Synced: %q)", stays, tc.wantStays, synced)
			}
			if stays && !strings.Contains(synced, "cannot delete the instance of web, which stays until it can") {
				t.Errorf("Synced message %q; want the way-out hint", synced)
			}
		})
	}
}

// TestTransientConnect: which Connect errors a resource without a sign
// of an instance waits out before it is let go.
func TestTransientConnect(t *testing.T) {
	gr := schema.GroupResource{Resource: "secrets"}
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"SecretGone":        {err: errors.New(`spec.kvm.credentials.secretRef: Secret team-a/ssh does not exist`)},
		"ConfigGone":        {err: errors.Wrap(kerrors.NewNotFound(gr, "home"), "cannot get ClusterProviderConfig home")},
		"Forbidden":         {err: kerrors.NewForbidden(gr, "ssh", errors.New("no"))},
		"PermanentBackend":  {err: proxy.Permanentf("key does not parse")},
		"NoSuchHost":        {err: &url.Error{Op: "Post", URL: "https://k8s.example", Err: &net.DNSError{Err: "no such host", Name: "k8s.example", IsNotFound: true}}},
		"APIServerBusy":     {err: errors.Wrap(kerrors.NewServiceUnavailable("busy"), "cannot get Secret"), want: true},
		"APIServerTimeout":  {err: kerrors.NewTimeoutError("slow", 1), want: true},
		"Throttled":         {err: kerrors.NewTooManyRequests("slow down", 1), want: true},
		"Deadline":          {err: errors.Wrap(context.DeadlineExceeded, "SelfSubjectAccessReview"), want: true},
		"ConnectionRefused": {err: &url.Error{Op: "Post", URL: "https://k8s.example", Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}}, want: true},
		"TransientBackend":  {err: proxy.Transientf("busy"), want: true},
	} {
		t.Run(name, func(t *testing.T) {
			if got := transientConnect(tc.err); got != tc.want {
				t.Errorf("transientConnect(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestDeletingPodProxyWithoutAnInstanceLetsGo: the same for a PodProxy,
// whose kubeconfig Secret never existed.
func TestDeletingPodProxyWithoutAnInstanceLetsGo(t *testing.T) {
	cfg := &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
		Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{Namespace: "proxies"}}}}
	for name, tc := range map[string]struct {
		configs   []client.Object
		made      bool
		wantStays bool
	}{
		"MissingConfig":               {},
		"SecretNeverExisted":          {configs: []client.Object{cfg}},
		"MissingConfigCreated":        {made: true, wantStays: true},
		"SecretNeverExistedButMadeIt": {configs: []client.Object{cfg}, made: true, wantStays: true},
	} {
		t.Run(name, func(t *testing.T) {
			c := &connector[spec.PodProxyParameters]{kind: podKind(errors.New(`spec.kubernetes.credentials.secretRef: Secret "team-a/kubeconfig" not found`))}
			now := metav1.Now()
			cr := &nsproxy.PodProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web", UID: testUID, DeletionTimestamp: &now}}
			meta.SetExternalName(cr, testName)
			cr.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "pods"})
			if tc.made {
				meta.SetExternalCreateSucceeded(cr, time.Now())
			}
			stays, synced := reconcileDeleting(t, c, nsproxy.PodProxyGroupVersionKind, cr, tc.configs...)
			if stays != tc.wantStays {
				t.Fatalf("resource still there: %v, want %v (Synced: %q)", stays, tc.wantStays, synced)
			}
		})
	}
}

// TestMadeInstance: what counts as a sign that a resource made or
// observed an instance.
func TestMadeInstance(t *testing.T) {
	ready := func(cr *nsproxy.KVMProxy) { cr.SetConditions(xpv2.Available()) }
	pending := func(cr *nsproxy.KVMProxy) { meta.SetExternalCreatePending(cr, time.Now()) }
	for name, tc := range map[string]struct {
		mod  func(*nsproxy.KVMProxy)
		want bool
	}{
		"Nothing":       {mod: func(*nsproxy.KVMProxy) {}},
		"SyncedOnly":    {mod: func(cr *nsproxy.KVMProxy) { cr.SetConditions(xpv2.ReconcileError(errors.New("boom"))) }},
		"DeletingOnly":  {mod: func(cr *nsproxy.KVMProxy) { cr.SetConditions(xpv2.Deleting()) }},
		"Pending":       {mod: pending, want: true},
		"ReadyObserved": {mod: ready, want: true},
		"State":         {mod: func(cr *nsproxy.KVMProxy) { cr.Status.AtProvider.State = "running" }, want: true},
		"ImportReady":   {mod: func(cr *nsproxy.KVMProxy) { observeOnlyPolicy(cr); ready(cr) }},
		"ImportPending": {mod: func(cr *nsproxy.KVMProxy) { observeOnlyPolicy(cr); pending(cr) }, want: true},
	} {
		t.Run(name, func(t *testing.T) {
			cr := proxyResource(tc.mod)
			if got := madeInstance[spec.KVMProxyParameters](cr); got != tc.want {
				t.Errorf("madeInstance: %v, want %v", got, tc.want)
			}
		})
	}
}

// deletingConnector is a connector on mem whose config resolves to a kvm
// block with installation testInstallation.
func deletingConnector(t *testing.T, mem proxy.Driver) *connector[spec.KVMProxyParameters] {
	t.Helper()
	k := testKind(nil)
	k.Backend.Connect = func(context.Context, *Config) (proxy.Driver, error) { return mem, nil }
	kvmConfig := &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home"},
		Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}}}
	kube := fake.NewClientBuilder().WithScheme(testenv.Scheme(t)).WithObjects(kvmConfig).Build()
	return &connector[spec.KVMProxyParameters]{
		kube:      kube,
		kind:      k,
		configs:   ConfigReader{Kube: kube, SecretReader: kube, Backends: []Backend{k.Backend}, InstallationID: testInstallation},
		modern:    resource.ModernTrackerFn(func(context.Context, resource.ModernManaged) error { return nil }),
		passwords: &Passwords{key: []byte("k")},
	}
}

func deletingProxy() *nsproxy.KVMProxy {
	return proxyResource(deleting, func(cr *nsproxy.KVMProxy) {
		cr.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "home"})
		cr.Status.AtProvider.ID = "memory/" + testName
	})
}

// TestDeletingOwnInstanceOfAnotherInstallation: an instance carrying the
// resource's own UID under another installation ID (the config's
// installationID was set since) is the resource's: Observe reports it and
// the Delete of the same reconcile deletes it under its own mark; the next
// reconcile finds it gone and lets the resource go. Another resource's
// instance, and an unmarked one, are left alone.
func TestDeletingOwnInstanceOfAnotherInstallation(t *testing.T) {
	const old = "installation-before"
	for name, tc := range map[string]struct {
		setup      func(t *testing.T, mem *proxytest.Memory)
		wantExists bool
		wantGone   bool
	}{
		"OwnUIDOtherInstallation": {
			setup: func(t *testing.T, mem *proxytest.Memory) {
				req := mem.Request(testName, testUID)
				req.Mark = proxy.Mark{UID: testUID, InstallationID: old}
				if _, err := mem.Create(context.Background(), req); err != nil {
					t.Fatal(err)
				}
			},
			wantExists: true, wantGone: true,
		},
		"OtherUIDSameInstallation": {
			setup: func(t *testing.T, mem *proxytest.Memory) {
				req := mem.Request(testName, "uid-other")
				req.Mark = proxy.Mark{UID: "uid-other", InstallationID: testInstallation}
				if _, err := mem.Create(context.Background(), req); err != nil {
					t.Fatal(err)
				}
			},
		},
		"Unmarked": {
			setup: func(t *testing.T, mem *proxytest.Memory) {
				if err := mem.Foreign(testName); err != nil {
					t.Fatal(err)
				}
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			mem := proxytest.NewMemory("memory", old)
			tc.setup(t, mem)
			c := deletingConnector(t, mem)

			// The first reconcile: Observe, then Delete when it exists.
			cr := deletingProxy()
			ec, err := c.Connect(context.Background(), cr)
			if err != nil {
				t.Fatal(err)
			}
			obs, err := ec.Observe(context.Background(), cr)
			if err != nil {
				t.Fatalf("Observe: %v", err)
			}
			if obs.ResourceExists != tc.wantExists {
				t.Fatalf("Observe: ResourceExists %v, want %v", obs.ResourceExists, tc.wantExists)
			}
			if got := cr.GetCondition(xpv2.TypeReady); got.Reason != xpv2.ReasonDeleting {
				t.Errorf("Ready %+v; want Deleting", got)
			}
			if obs.ResourceExists {
				if _, err := ec.Delete(context.Background(), cr); err != nil {
					t.Fatalf("Delete: %v", err)
				}
			}
			if there := len(mem.Instances()) > 0; there == tc.wantGone {
				t.Fatalf("instance still there: %v, want %v", there, !tc.wantGone)
			}

			// The next reconcile, with a client of its own.
			cr = deletingProxy()
			ec, err = c.Connect(context.Background(), cr)
			if err != nil {
				t.Fatal(err)
			}
			if obs, err := ec.Observe(context.Background(), cr); err != nil || obs.ResourceExists {
				t.Fatalf("second Observe: %+v, %v; want the resource let go", obs, err)
			}
		})
	}
}

// TestDeletingRecordsTheInstanceFound: an instance a resource being
// deleted finds by name (a create cut short before anything was
// recorded) is recorded by its ID, a sign that keeps the resource until
// it is deleted, whatever happens to the config meanwhile.
func TestDeletingRecordsTheInstanceFound(t *testing.T) {
	mem := proxytest.NewMemory("memory", testInstallation)
	req := mem.Request(testName, testUID)
	req.Mark = proxy.Mark{UID: testUID, InstallationID: testInstallation}
	if _, err := mem.Create(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	c := deletingConnector(t, mem)
	cr := deletingProxy()
	cr.Status.AtProvider.ID = ""
	ec, err := c.Connect(context.Background(), cr)
	if err != nil {
		t.Fatal(err)
	}
	if obs, err := ec.Observe(context.Background(), cr); err != nil || !obs.ResourceExists {
		t.Fatalf("Observe: %+v, %v; want the instance", obs, err)
	}
	if got := cr.Status.AtProvider.ID; got != "memory/"+testName || !madeInstance[spec.KVMProxyParameters](cr) {
		t.Errorf("status.atProvider.id %q (madeInstance %v); want memory/%s recorded", got, madeInstance[spec.KVMProxyParameters](cr), testName)
	}
}

// TestDeletingErrorsSayTheWayOut: an Observe or Delete error of a resource
// being deleted says that the instance (and the resource) stays, and the
// ways out; Ready reads Deleting meanwhile.
func TestDeletingErrorsSayTheWayOut(t *testing.T) {
	const hint = "cannot delete the instance of web, which stays until it can: it is retried with backoff until the backend answers (restore the backend, or its place in the config, if either is gone) (or, to leave the instance on the backend, set this resource's spec.managementPolicies to [\"Observe\", \"Create\", \"Update\", \"LateInitialize\"]: its deletion then lets the instance go without deleting it, to the config's orphan sweep where a ClusterProviderConfig does not allowTenantRelease): "
	mem := proxytest.NewMemory("memory", testInstallation)
	c := deletingConnector(t, mem)
	cr := deletingProxy()
	cr.SetConditions(xpv2.Available())
	req := mem.Request(testName, testUID)
	req.Mark = proxy.Mark{UID: testUID, InstallationID: testInstallation}
	if _, err := mem.Create(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	ec, err := c.Connect(context.Background(), cr)
	if err != nil {
		t.Fatal(err)
	}
	mem.FailNext(proxytest.OpGet, proxy.Transientf("busy"))
	_, err = ec.Observe(context.Background(), cr)
	if diff := cmp.Diff(hint+"cannot observe the instance being deleted (Transient, will retry): memory: get: busy", errText(err)); diff != "" {
		t.Errorf("Observe error: -want, +got:\n%s", diff)
	}
	if got := cr.GetCondition(xpv2.TypeReady); got.Reason != xpv2.ReasonDeleting || got.ObservedGeneration != cr.GetGeneration() {
		t.Errorf("Ready %+v; want Deleting of generation %d", got, cr.GetGeneration())
	}
	mem.FailNext(proxytest.OpDelete, proxy.Transientf("busy"))
	_, err = ec.Delete(context.Background(), cr)
	if diff := cmp.Diff(hint+"cannot delete the instance (Transient, will retry): memory: delete: busy", errText(err)); diff != "" {
		t.Errorf("Delete error: -want, +got:\n%s", diff)
	}

	// A resource that is not being deleted gets the errors as they are.
	live := proxyResource(func(cr *nsproxy.KVMProxy) {
		cr.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "home"})
	})
	ec, err = c.Connect(context.Background(), live)
	if err != nil {
		t.Fatal(err)
	}
	mem.FailNext(proxytest.OpGet, proxy.Transientf("busy"))
	if _, err := ec.Observe(context.Background(), live); err == nil || strings.Contains(err.Error(), "which stays until it can") {
		t.Errorf("Observe error of a live resource: %v; want one without the hint", err)
	}
}

// TestFinalizerReleasesFirst: the kind's Release hook runs before the
// finalizer of a resource being deleted goes; its error keeps the
// finalizer and the children.
func TestFinalizerReleasesFirst(t *testing.T) {
	for name, tc := range map[string]struct {
		err       error
		deleting  bool
		wantCalls int
	}{
		"Released":        {deleting: true, wantCalls: 1},
		"ReleaseFails":    {deleting: true, err: kerrors.NewConflict(schema.GroupResource{Group: "apps", Resource: "deployments"}, "px-1", errors.New("changed")), wantCalls: 1},
		"NotBeingDeleted": {},
	} {
		t.Run(name, func(t *testing.T) {
			calls := 0
			release := func(_ context.Context, kube client.Client, mg resource.Managed) error {
				calls++
				if kube == nil || mg.GetUID() != testUID {
					t.Errorf("Release(%v, %s)", kube, mg.GetUID())
				}
				return tc.err
			}
			mods := []func(*nsproxy.KVMProxy){withConnectionSecret("web-conn")}
			if tc.deleting {
				mods = append(mods, deleting)
			}
			cr := proxyResource(mods...)
			meta.AddFinalizer(cr, managed.FinalizerName)
			owner := []metav1.OwnerReference{meta.AsController(meta.TypedReferenceTo(cr, nsproxy.KVMProxyGroupVersionKind))}
			sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web-conn", OwnerReferences: owner}}
			kube := fake.NewClientBuilder().WithScheme(testenv.Scheme(t)).WithObjects(cr, sec).Build()
			f := childrenFinalizer{Finalizer: resource.NewAPIFinalizer(kube, managed.FinalizerName), kube: kube, release: release}
			err := f.RemoveFinalizer(context.Background(), cr)
			if tc.err != nil {
				if !kerrors.IsConflict(err) {
					t.Errorf("RemoveFinalizer: %v; want the hook's conflict", err)
				}
				if !meta.FinalizerExists(cr, managed.FinalizerName) {
					t.Error("the finalizer went although Release failed")
				}
				if err := kube.Get(context.Background(), client.ObjectKeyFromObject(sec), &corev1.Secret{}); err != nil {
					t.Errorf("the connection Secret: %v; want it kept while the finalizer stays", err)
				}
			} else if err != nil && !kerrors.IsNotFound(err) {
				t.Errorf("RemoveFinalizer: %v", err)
			}
			if calls != tc.wantCalls {
				t.Errorf("Release called %d times, want %d", calls, tc.wantCalls)
			}
		})
	}
}

// gcpKind is a GCPProxy kind resolving as internal/controller/gcp's
// request does (zone first, then the catalogue keys) on the real GCP
// driver over srv, with one zone and one key of each catalogue.
func gcpKind(t *testing.T, srv *gcptest.Server) Kind[spec.GCPProxyParameters] {
	t.Helper()
	api, err := gcpbackend.NewSDK(context.Background(), srv.Project, option.WithEndpoint(srv.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Close() })
	d := gcpbackend.New(gcpbackend.Options{Provider: "ClusterProviderConfig gcp", API: api, Config: gcpbackend.Config{Project: srv.Project,
		Zones: []string{"europe-west1-b"}, MachineTypes: map[string]string{"small": "e2-small"}, Images: map[string]string{"debian": "x"}}})
	return Kind[spec.GCPProxyParameters]{
		Name:     "GCPProxy",
		Location: func(p *spec.Placement) *string { return &p.Zone },
		Proxy:    func(p *spec.GCPProxyParameters) *spec.ProxySettings { return &p.Proxy },
		Request: func(cfg *Config, p *spec.GCPProxyParameters, req *proxy.Request) error {
			g := cfg.Spec.GCP
			zone := p.Zone
			if zone == "" {
				zone = g.Zones[0]
			}
			if _, err := Pick("spec.forProvider.zone", zone, req.Placement.Location, g.Zones, cfg); err != nil {
				return err
			}
			req.Placement.Location = zone
			var err error
			if req.Placement.MachineType, err = Pick("spec.forProvider.machineType", p.MachineType, req.Placement.MachineType, Keys(g.MachineTypes), cfg); err != nil {
				return err
			}
			req.Placement.Image, err = Pick("spec.forProvider.image", p.Image, req.Placement.Image, Keys(g.Images), cfg)
			return err
		},
		Backend: Backend{Name: "gcp", Block: func(s *spec.ProviderConfigSpec) (Block, bool) { return Block{}, s.GCP != nil },
			Connect: func(context.Context, *Config) (proxy.Driver, error) { return d, nil }},
	}
}

// TestDeletingInvalidSpecLetsGo: a GCPProxy whose spec names a key, zone
// or image the config lacks (admission cannot see the catalogues) never
// made an instance; deleting it, as its namespace's deletion does, lets it
// go through the real managed reconciler and the real GCP driver. An
// instance of its name and mark (a create cut short before its
// annotation) is found in the zone the spec resolved and deleted first.
// One that carries a sign of an instance and whose spec leaves the
// driver nowhere to look stays, saying that waiting will not help.
func TestDeletingInvalidSpecLetsGo(t *testing.T) {
	const name = "team-a-web-1234abcd"
	cfg := &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "gcp"},
		Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{InstallationID: testInstallation, GCP: &spec.GCPConfig{
			Zones: []string{"europe-west1-b"}, MachineTypes: map[string]spec.GCPMachineType{"small": {}}, Images: map[string]spec.GCPImage{"debian": {}}}}}}
	machineType := func(v string) func(*nsproxy.GCPProxy) {
		return func(cr *nsproxy.GCPProxy) { cr.Spec.ForProvider.MachineType = v }
	}
	image := func(v string) func(*nsproxy.GCPProxy) {
		return func(cr *nsproxy.GCPProxy) { cr.Spec.ForProvider.Image = v }
	}
	zone := func(v string) func(*nsproxy.GCPProxy) {
		return func(cr *nsproxy.GCPProxy) { cr.Spec.ForProvider.Zone = v }
	}
	succeeded := func(cr *nsproxy.GCPProxy) { meta.SetExternalCreateSucceeded(cr, time.Now()) }
	pending := func(cr *nsproxy.GCPProxy) { meta.SetExternalCreatePending(cr, time.Now()) }
	withID := func(cr *nsproxy.GCPProxy) { cr.Status.AtProvider.ID = "zones/europe-west1-c/instances/" + name }
	for tcName, tc := range map[string]struct {
		mods         []func(*nsproxy.GCPProxy)
		instance     bool
		wantStays    bool
		wantDeletion bool
	}{
		"ValidSpec":                   {},
		"UnknownMachineType":          {mods: []func(*nsproxy.GCPProxy){machineType("smal")}},
		"UnknownImage":                {mods: []func(*nsproxy.GCPProxy){image("debain")}},
		"UnknownZone":                 {mods: []func(*nsproxy.GCPProxy){zone("europe-west1-c")}},
		"UnknownMachineTypeInstance":  {mods: []func(*nsproxy.GCPProxy){machineType("smal")}, instance: true, wantDeletion: true},
		"UnknownZoneCreateSucceeded":  {mods: []func(*nsproxy.GCPProxy){zone("europe-west1-c"), succeeded}, wantStays: true},
		"UnknownZoneCreatePending":    {mods: []func(*nsproxy.GCPProxy){zone("europe-west1-c"), pending}, wantStays: true},
		"UnknownZoneWithIDIsLookedUp": {mods: []func(*nsproxy.GCPProxy){zone("europe-west1-c"), withID}},
	} {
		t.Run(tcName, func(t *testing.T) {
			srv := gcptest.New(t, "p")
			if tc.instance {
				srv.PutInstance("europe-west1-b", name, map[string]string{gcpbackend.LabelUID: testUID, gcpbackend.LabelInstallation: testInstallation})
			}
			c := &connector[spec.GCPProxyParameters]{kind: gcpKind(t, srv)}
			now := metav1.Now()
			cr := &nsproxy.GCPProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web", UID: testUID, DeletionTimestamp: &now}}
			meta.SetExternalName(cr, name)
			cr.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "gcp"})
			cr.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"10.0.0.0/8"}
			for _, m := range tc.mods {
				m(cr)
			}
			var stays bool
			var synced string
			for range 3 {
				if stays, synced = reconcileDeleting(t, c, nsproxy.GCPProxyGroupVersionKind, cr.DeepCopy(), cfg.DeepCopy()); !stays {
					break
				}
				srv.SettleAll()
			}
			if stays != tc.wantStays {
				t.Fatalf("resource still there: %v, want %v (Synced: %q)", stays, tc.wantStays, synced)
			}
			if stays && (!strings.Contains(synced, "this cannot succeed until what the error names changes") || !strings.Contains(synced, "no valid zone")) {
				t.Errorf("Synced %q; want it to say that the Delete cannot succeed as things are, and why", synced)
			}
			deleted := slices.ContainsFunc(srv.Requests(), func(r string) bool {
				return strings.HasPrefix(r, "DELETE zones/europe-west1-b/instances/"+name+"?")
			})
			if deleted != tc.wantDeletion {
				t.Errorf("instance %s deleted: %v, want %v (requests %q)", name, deleted, tc.wantDeletion, srv.Requests())
			}
		})
	}
}
