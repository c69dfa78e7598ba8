package external

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry/otlptest"
)

// The unit tests of the external client run every kind's path through the
// in-memory reference driver (proxytest.Memory) and crossplane-runtime's
// mock client, with a test kind on KVMProxy's Go types: what they cover is
// the generic layer, the same for every kind.

const (
	testInstallation = "unit-install"
	testUID          = "uid-1"
	testName         = "px-1"
)

// testKind is a kind whose Request places every proxy at "local" on
// "small"/"squid" (the memory driver's catalogue), or fails with failRequest.
func testKind(failRequest error) Kind[spec.KVMProxyParameters] {
	return Kind[spec.KVMProxyParameters]{
		Name:     "KVMProxy",
		Location: func(p *spec.Placement) *string { return &p.Host },
		Proxy:    func(p *spec.KVMProxyParameters) *spec.ProxySettings { return &p.Proxy },
		Request: func(_ *Config, p *spec.KVMProxyParameters, req *proxy.Request) error {
			if failRequest != nil {
				return failRequest
			}
			req.Placement = proxy.Placement{Location: "local", MachineType: "small", Image: "squid"}
			req.CloudInit = p.CloudInit
			return nil
		},
		Backend: Backend{Name: "kvm", Block: func(s *spec.ProviderConfigSpec) (Block, bool) { return Block{}, s.KVM != nil }},
	}
}

// proxyResource is a KVMProxy named testName with UID testUID; mods change it.
func proxyResource(mods ...func(*nsproxy.KVMProxy)) *nsproxy.KVMProxy {
	cr := &nsproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web", UID: testUID, Generation: 3}}
	meta.SetExternalName(cr, testName)
	cr.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"10.0.0.0/8"}
	for _, m := range mods {
		m(cr)
	}
	return cr
}

func deleting(cr *nsproxy.KVMProxy) {
	now := metav1.Now()
	cr.SetDeletionTimestamp(&now)
}

func observeOnlyPolicy(cr *nsproxy.KVMProxy) {
	cr.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve})
}

// newExternal is the external client on mem with kube as its client.
func newExternal(k Kind[spec.KVMProxyParameters], mem proxy.Driver, kube client.Client) *external[spec.KVMProxyParameters] {
	if kube == nil {
		kube = &test.MockClient{}
	}
	return &external[spec.KVMProxyParameters]{
		kube:      kube,
		kind:      k,
		cfg:       &Config{Name: "ClusterProviderConfig home", InstallationID: testInstallation, Spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}},
		driver:    mem,
		passwords: &Passwords{key: []byte("unit-test-key")},
	}
}

// kindOr is k, or testKind(nil) for a case that names no kind.
func kindOr(k Kind[spec.KVMProxyParameters]) Kind[spec.KVMProxyParameters] {
	if k.Name == "" {
		return testKind(nil)
	}
	return k
}

// setupOurs is ours as a case's setup.
func setupOurs(t *testing.T, mem *proxytest.Memory, e *external[spec.KVMProxyParameters]) {
	ours(t, mem, e)
}

// setupForeign makes testName an unmarked instance in mem.
func setupForeign(t *testing.T, mem *proxytest.Memory, _ *external[spec.KVMProxyParameters]) {
	t.Helper()
	if err := mem.Foreign(testName); err != nil {
		t.Fatal(err)
	}
}

// foreignOnTenantConfig is setupForeign for a namespaced resource on a
// ClusterProviderConfig, which allows tenant imports or not.
func foreignOnTenantConfig(allowImports bool) func(*testing.T, *proxytest.Memory, *external[spec.KVMProxyParameters]) {
	return func(t *testing.T, mem *proxytest.Memory, e *external[spec.KVMProxyParameters]) {
		t.Helper()
		setupForeign(t, mem, e)
		e.cfg.Tenant, e.cfg.Spec.AllowTenantImports = true, allowImports
	}
}

// ours creates testName in mem, as this resource's, and lets it settle.
func ours(t *testing.T, mem *proxytest.Memory, e *external[spec.KVMProxyParameters]) proxy.Request {
	t.Helper()
	req, err := e.request(context.Background(), proxyResource())
	if err != nil {
		t.Fatal(err)
	}
	inst, err := mem.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := mem.Settle(inst.ID); err != nil {
		t.Fatal(err)
	}
	return req
}

func TestObserve(t *testing.T) {
	errBoom := errors.New("boom")
	type want struct {
		obs   managed.ExternalObservation
		err   error
		ready xpv2.Condition
		state string
	}
	// running is what Observe reports of an instance that runs and
	// answers, its spec as the resource's (upToDate) or not.
	running := func(upToDate bool) want {
		return want{
			obs:   managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: upToDate},
			ready: xpv2.Available().WithObservedGeneration(3),
			state: string(proxy.StateRunning),
		}
	}
	// An import of an unmarked instance, Ready saying it is not the
	// provider's.
	imported := func() want {
		w := running(true)
		w.ready = xpv2.Available().WithMessage("instance px-1 is not the provider's (it carries no ownership mark; imported Observe-only, so any Squid answering counts)").WithObservedGeneration(3)
		return w
	}
	cases := map[string]struct {
		reason string
		cr     *nsproxy.KVMProxy
		kind   Kind[spec.KVMProxyParameters]
		setup  func(t *testing.T, mem *proxytest.Memory, e *external[spec.KVMProxyParameters])
		want   want
	}{
		"NotFound": {
			reason: "A missing instance is reported as not existing, and the stale status is cleared.",
			cr:     proxyResource(func(cr *nsproxy.KVMProxy) { cr.Status.AtProvider.ID = "memory/" + testName }),
			want:   want{obs: managed.ExternalObservation{ResourceExists: false}},
		},
		"RunningAndReachable": {
			reason: "An instance of ours that runs and answers is up to date and Ready, with its connection details.",
			cr:     proxyResource(),
			setup:  setupOurs,
			want:   running(true),
		},
		"Provisioning": {
			reason: "An instance still booting reads Creating with its progress.",
			cr:     proxyResource(),
			setup: func(t *testing.T, mem *proxytest.Memory, e *external[spec.KVMProxyParameters]) {
				req, _ := e.request(context.Background(), proxyResource())
				if _, err := mem.Create(context.Background(), req); err != nil {
					t.Fatal(err)
				}
			},
			want: want{
				obs:   managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true},
				ready: xpv2.Creating().WithMessage("instance px-1 is provisioning: booting").WithObservedGeneration(3),
				state: string(proxy.StateProvisioning),
			},
		},
		"SettingsChanged": {
			reason: "An instance built from other settings needs an update.",
			cr:     proxyResource(func(cr *nsproxy.KVMProxy) { cr.Spec.ForProvider.Proxy.AllowedPorts = []int32{8443} }),
			setup:  setupOurs,
			want:   running(false),
		},
		"Unmarked": {
			reason: "An unmarked instance of the same name is never adopted.",
			cr:     proxyResource(),
			setup:  setupForeign,
			want:   want{err: errors.Errorf("instance %s exists but was not created by provider-egressproxy (it carries no ownership mark); refusing to adopt it: remove or rename it on the backend, or import it with spec.managementPolicies: [\"Observe\"]", testName)},
		},
		"UnmarkedImport": {
			reason: "An Observe-only resource may import an unmarked instance; Ready says it is not the provider's.",
			cr:     proxyResource(observeOnlyPolicy),
			setup:  setupForeign,
			want:   imported(),
		},
		"TenantImportRefused": {
			reason: "A namespaced resource on the platform's config never reads the platform's hand-made instances by their name.",
			cr:     proxyResource(observeOnlyPolicy),
			setup:  foreignOnTenantConfig(false),
			want:   want{err: errors.Errorf("instance %s was not created by provider-egressproxy (it carries no ownership mark), and ClusterProviderConfig home does not let namespaced resources import such instances (its allowTenantImports is false, the default); refusing to import it: use a ProviderConfig of this namespace, or ask the platform team to set allowTenantImports: true", testName)},
		},
		"TenantImportAllowed": {
			reason: "The platform's config may let tenants import hand-made instances.",
			cr:     proxyResource(observeOnlyPolicy),
			setup:  foreignOnTenantConfig(true),
			want:   imported(),
		},
		"TenantUnmarked": {
			reason: "A tenant on the platform's config is not told to import what it may not.",
			cr:     proxyResource(),
			setup:  foreignOnTenantConfig(false),
			want:   want{err: errors.Errorf("instance %s exists but was not created by provider-egressproxy (it carries no ownership mark); refusing to adopt it: choose another external name", testName)},
		},
		"AnotherResourcesImport": {
			reason: "An Observe-only resource never imports an instance made for another resource.",
			cr:     proxyResource(observeOnlyPolicy),
			setup: func(t *testing.T, mem *proxytest.Memory, _ *external[spec.KVMProxyParameters]) {
				if err := mem.ForeignMarked(testName, "uid-other"); err != nil {
					t.Fatal(err)
				}
			},
			want: want{err: errors.Errorf("instance %s belongs to another resource (UID uid-other, installation %q); refusing to import it: an instance the provider created is observed only through the resource it was created for", testName, "proxytest-installation")},
		},
		"OwnInstanceOfAnotherInstallation": {
			reason: "The resource's own instance, made before the config's installationID changed, is named as such.",
			cr:     proxyResource(),
			setup: func(t *testing.T, mem *proxytest.Memory, e *external[spec.KVMProxyParameters]) {
				setupOurs(t, mem, e)
				e.cfg.InstallationID = "prod-eu"
			},
			want: want{err: errors.Errorf("instance %s was made by this resource under installation %q, but %s now gives installation %q; refusing to manage it under another installation's mark: run the provider with --installation-id=%s (or restore its ConfigMap), or set the config's installationID to it (an installation ID does not move instances made before it)", testName, "unit-install", "ClusterProviderConfig home", "prod-eu", "unit-install")},
		},
		"OwnInstanceOfTheConfigsFormerInstallation": {
			reason: "Where the config's own installationID changed, the message says to give it back.",
			cr:     proxyResource(),
			setup: func(t *testing.T, mem *proxytest.Memory, e *external[spec.KVMProxyParameters]) {
				setupOurs(t, mem, e)
				e.cfg.InstallationID, e.cfg.Spec.InstallationID = "prod-eu", "prod-eu"
			},
			want: want{err: errors.Errorf("instance %s was made by this resource under installation %q, but %s now gives installation %q; refusing to manage it under another installation's mark: give the config back installationID %q (an installation ID does not move instances made before it)", testName, "unit-install", "ClusterProviderConfig home", "prod-eu", "unit-install")},
		},
		"TransientDriverError": {
			reason: "A driver error says what failed and that it is retried.",
			cr:     proxyResource(),
			setup: func(_ *testing.T, mem *proxytest.Memory, _ *external[spec.KVMProxyParameters]) {
				mem.FailNext(proxytest.OpGet, proxy.Transientf("backend busy"))
			},
			want: want{err: errors.New("cannot observe the instance (Transient, will retry): memory: get: backend busy")},
		},
		"RequestError": {
			reason: "A kind's request error (a catalogue key the config lacks) is returned as it is.",
			cr:     proxyResource(),
			kind:   testKind(errBoom),
			want:   want{err: errBoom},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			mem := proxytest.NewMemory("memory", "proxytest-installation")
			e := newExternal(kindOr(tc.kind), mem, nil)
			if tc.setup != nil {
				tc.setup(t, mem, e)
			}
			got, err := e.Observe(context.Background(), tc.cr)
			if diff := cmp.Diff(errText(tc.want.err), errText(err)); diff != "" {
				t.Errorf("\n%s\nObserve(...): -want error, +got error:\n%s", tc.reason, diff)
			}
			if diff := cmp.Diff(tc.want.obs, got, cmpopts.IgnoreFields(managed.ExternalObservation{}, "ConnectionDetails")); diff != "" {
				t.Errorf("\n%s\nObserve(...): -want, +got:\n%s", tc.reason, diff)
			}
			if tc.want.err != nil || !tc.want.obs.ResourceExists {
				return
			}
			if diff := cmp.Diff(tc.want.ready, tc.cr.GetCondition(xpv2.TypeReady), test.EquateConditions()); diff != "" {
				t.Errorf("\n%s\nReady: -want, +got:\n%s", tc.reason, diff)
			}
			if got := tc.cr.Status.AtProvider.State; got != tc.want.state {
				t.Errorf("\n%s\nstatus.atProvider.state %q, want %q", tc.reason, got, tc.want.state)
			}
			if !got.ResourceExists && tc.cr.Status.AtProvider.ID != "" {
				t.Errorf("\n%s\nstatus.atProvider.id %q kept for an instance that does not exist", tc.reason, tc.cr.Status.AtProvider.ID)
			}
		})
	}
}

// errText is what a user sees of err in the Synced condition: the
// external client's errors wrap the driver's classified ones.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestObserveSetsStatus(t *testing.T) {
	mem := proxytest.NewMemory("memory", "proxytest-installation")
	e := newExternal(testKind(nil), mem, nil)
	ours(t, mem, e)
	cr := proxyResource()
	if _, err := e.Observe(context.Background(), cr); err != nil {
		t.Fatal(err)
	}
	got := cr.Status.AtProvider
	want := spec.ProxyObservation{
		ID: "memory/" + testName, State: string(proxy.StateRunning), IP: got.IP, ProxyReachable: true,
		Endpoint: got.IP + ":3128", CreatedAt: got.CreatedAt,
		Placement: &spec.Placement{Host: "local", MachineType: "small", Image: "squid"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status.atProvider: -want, +got:\n%s", diff)
	}
	if got.IP == "" || got.CreatedAt == nil {
		t.Errorf("status.atProvider: IP %q, createdAt %v; want both", got.IP, got.CreatedAt)
	}
}

func TestObserveDeleting(t *testing.T) {
	cases := map[string]struct {
		reason    string
		setup     func(t *testing.T, mem *proxytest.Memory, e *external[spec.KVMProxyParameters])
		kind      Kind[spec.KVMProxyParameters]
		want      managed.ExternalObservation
		wantErr   error
		wantCalls []string
	}{
		"Gone": {
			reason:    "An instance that is gone lets the resource go.",
			want:      managed.ExternalObservation{ResourceExists: false},
			wantCalls: []string{"get px-1"},
		},
		"Ours": {
			reason:    "Our instance exists, and nothing is updated on the way out.",
			setup:     setupOurs,
			want:      managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true},
			wantCalls: []string{"create px-1", "get px-1"},
		},
		"Foreign": {
			reason: "An instance that was never ours is left alone, and the resource goes.",
			setup: func(t *testing.T, mem *proxytest.Memory, _ *external[spec.KVMProxyParameters]) {
				if err := mem.ForeignMarked(testName, "uid-other"); err != nil {
					t.Fatal(err)
				}
			},
			want:      managed.ExternalObservation{ResourceExists: false},
			wantCalls: []string{"get px-1"},
		},
		"PermanentReadIsHandedToDelete": {
			reason: "An instance that cannot be read for good is handed to Delete at once.",
			setup: func(_ *testing.T, mem *proxytest.Memory, _ *external[spec.KVMProxyParameters]) {
				mem.FailNext(proxytest.OpGet, proxy.Permanentf("host gone from the config"))
			},
			want:      managed.ExternalObservation{ResourceExists: false},
			wantCalls: []string{"get px-1", "delete px-1"},
		},
		"PermanentReadAndDeleteFails": {
			reason: "When that Delete fails too, both reasons are reported.",
			setup: func(_ *testing.T, mem *proxytest.Memory, _ *external[spec.KVMProxyParameters]) {
				mem.FailNext(proxytest.OpGet, proxy.Permanentf("host gone"))
				mem.FailNext(proxytest.OpDelete, proxy.Transientf("busy"))
			},
			wantErr:   errors.New("cannot delete the instance (it cannot be read either: memory: get: host gone) (Transient, will retry): memory: delete: busy"),
			wantCalls: []string{"get px-1", "delete px-1"},
		},
		"TransientRead": {
			reason: "A read that may succeed later is retried, never taken as gone.",
			setup: func(_ *testing.T, mem *proxytest.Memory, _ *external[spec.KVMProxyParameters]) {
				mem.FailNext(proxytest.OpGet, proxy.Transientf("busy"))
			},
			wantErr:   errors.New("cannot observe the instance being deleted (Transient, will retry): memory: get: busy"),
			wantCalls: []string{"get px-1"},
		},
		"PlacementNoLongerResolves": {
			reason:    "A resource whose placement the config no longer has is still found (drivers find it by ID) and reads no Secret.",
			kind:      testKind(errors.New("spec.forProvider.host: \"gone\" is not in the config")),
			want:      managed.ExternalObservation{ResourceExists: false},
			wantCalls: []string{"get px-1"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			mem := proxytest.NewMemory("memory", "proxytest-installation")
			// Any read of a Secret fails the test: a resource being
			// deleted must not need its password Secret.
			kube := &test.MockClient{MockGet: func(context.Context, client.ObjectKey, client.Object) error {
				t.Error("a resource being deleted read a Secret")
				return errors.New("unexpected Get")
			}}
			e := newExternal(testKind(nil), mem, kube)
			if tc.setup != nil {
				tc.setup(t, mem, e)
			}
			e.kind = kindOr(tc.kind)
			e.secrets = Secrets{Kube: kube}
			cr := proxyResource(deleting, func(cr *nsproxy.KVMProxy) {
				cr.Spec.ForProvider.Proxy.Auth = &spec.ProxyAuth{Enabled: true, PasswordSecretRef: &spec.SecretKeySelector{}}
			})
			got, err := e.Observe(context.Background(), cr)
			if diff := cmp.Diff(errText(tc.wantErr), errText(err)); diff != "" {
				t.Errorf("\n%s\nObserve(...): -want error, +got error:\n%s", tc.reason, diff)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("\n%s\nObserve(...): -want, +got:\n%s", tc.reason, diff)
			}
			if diff := cmp.Diff(tc.wantCalls, mem.Calls()); diff != "" {
				t.Errorf("\n%s\ndriver calls: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

// TestRefAsksForLiveReads: a resource being deleted and an import ask the
// driver to read the backend itself (Ref.Live); a resource that creates
// does not. Only a resource being deleted has Ref.Deleting.
func TestRefAsksForLiveReads(t *testing.T) {
	cases := map[string]struct {
		cr           *nsproxy.KVMProxy
		live, delete bool
	}{
		"Creates":  {cr: proxyResource()},
		"Deleting": {cr: proxyResource(deleting), live: true, delete: true},
		"Import":   {cr: proxyResource(observeOnlyPolicy), live: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := ref(tc.cr, proxy.Request{Name: testName}, &tc.cr.Status.AtProvider)
			if got.Live != tc.live || got.Deleting != tc.delete {
				t.Errorf("ref(...): Live %v, Deleting %v; want %v, %v", got.Live, got.Deleting, tc.live, tc.delete)
			}
		})
	}
}

func TestCreate(t *testing.T) {
	cases := map[string]struct {
		reason      string
		setup       func(mem *proxytest.Memory)
		patchErr    error
		operation   bool
		wantErr     error
		wantPatched bool
	}{
		"Created": {
			reason: "A create returns at once; the observation is saved with the status write that follows.",
		},
		"Fails": {
			reason:  "A create the backend refuses says so, classified.",
			setup:   func(mem *proxytest.Memory) { mem.FailNext(proxytest.OpCreate, proxy.Quotaf("no capacity")) },
			wantErr: errors.New("cannot create the instance (out of quota or capacity on the backend): memory: create: no capacity"),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			mem := proxytest.NewMemory("memory", "proxytest-installation")
			if tc.setup != nil {
				tc.setup(mem)
			}
			patched := false
			kube := &test.MockClient{MockStatusPatch: func(context.Context, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
				patched = true
				return tc.patchErr
			}}
			e := newExternal(testKind(nil), mem, kube)
			cr := proxyResource()
			got, err := e.Create(context.Background(), cr)
			if diff := cmp.Diff(errText(tc.wantErr), errText(err)); diff != "" {
				t.Fatalf("\n%s\nCreate(...): -want error, +got error:\n%s", tc.reason, diff)
			}
			if patched != tc.wantPatched {
				t.Errorf("\n%s\nstatus patched: %v, want %v", tc.reason, patched, tc.wantPatched)
			}
			if tc.wantErr != nil {
				return
			}
			// Provisioning, no address yet: no connection details (keys
			// without a value only remove), Creating.
			if slices.ContainsFunc(slices.Collect(maps.Values(got.ConnectionDetails)), func(v []byte) bool { return v != nil }) {
				t.Errorf("\n%s\nconnection details %v before an address is known", tc.reason, got.ConnectionDetails)
			}
			if diff := cmp.Diff(xpv2.Creating().WithMessage("instance px-1 is provisioning: booting").WithObservedGeneration(3), cr.GetCondition(xpv2.TypeReady), test.EquateConditions()); diff != "" {
				t.Errorf("\n%s\nReady: -want, +got:\n%s", tc.reason, diff)
			}
			if cr.Status.AtProvider.ID != "memory/"+testName {
				t.Errorf("\n%s\nstatus.atProvider.id %q", tc.reason, cr.Status.AtProvider.ID)
			}
			spec, ok := mem.Spec(testName)
			if !ok || spec.Mark != (proxy.Mark{UID: testUID, InstallationID: testInstallation}) || spec.SecretDigest == "" {
				t.Errorf("\n%s\nthe driver got mark %+v, secret digest %q; want the resource's mark and a digest", tc.reason, spec.Mark, spec.SecretDigest)
			}
		})
	}
}

// operationDriver reports an operation in flight on Create.
type operationDriver struct{ proxy.Driver }

func (d operationDriver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	inst, err := d.Driver.Create(ctx, req)
	inst.Operation = "operations/op-1"
	return inst, err
}

// TestCreateSavesAnOperationAtOnce: an operation in flight is written to
// status.atProvider by a status patch right away, so its outcome is never
// lost; a failed patch fails the create.
func TestCreateSavesAnOperationAtOnce(t *testing.T) {
	errBoom := errors.New("boom")
	for name, tc := range map[string]struct {
		patchErr error
		wantErr  error
	}{
		"Saved":     {},
		"SaveFails": {patchErr: errBoom, wantErr: errors.Wrap(errBoom, "cannot save status.atProvider")},
	} {
		t.Run(name, func(t *testing.T) {
			var patch []byte
			kube := &test.MockClient{MockStatusPatch: func(_ context.Context, obj client.Object, p client.Patch, _ ...client.SubResourcePatchOption) error {
				patch, _ = p.Data(obj)
				// The server answers with its own status, which has
				// none of what Create recorded.
				obj.(*nsproxy.KVMProxy).Status = nsproxy.KVMProxyStatus{} //nolint:forcetypeassert // the test's own object.
				return tc.patchErr
			}}
			mem := proxytest.NewMemory("memory", "proxytest-installation")
			e := newExternal(testKind(nil), operationDriver{mem}, kube)
			cr := proxyResource()
			_, err := e.Create(context.Background(), cr)
			if diff := cmp.Diff(tc.wantErr, err, test.EquateErrors()); diff != "" {
				t.Errorf("Create(...): -want error, +got error:\n%s", diff)
			}
			if want := `"operation":"operations/op-1"`; !strings.Contains(string(patch), want) {
				t.Errorf("status patch %s; want it to carry %s", patch, want)
			}
			// What Create recorded survives the patch's answer, for the
			// status write that follows Create.
			if cr.Status.AtProvider.Operation != "operations/op-1" || cr.GetCondition(spec.TypeSecure).Reason == "" {
				t.Errorf("after Create: operation %q, Secure %+v; want what Create recorded", cr.Status.AtProvider.Operation, cr.GetCondition(spec.TypeSecure))
			}
		})
	}
}

func TestUpdate(t *testing.T) {
	mem := proxytest.NewMemory("memory", "proxytest-installation")
	e := newExternal(testKind(nil), mem, nil)
	ours(t, mem, e)
	cr := proxyResource(func(cr *nsproxy.KVMProxy) {
		cr.Spec.ForProvider.Proxy.AllowedPorts = []int32{8443}
		cr.Status.AtProvider.ID = "memory/" + testName
	})
	got, err := e.Update(context.Background(), cr)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := mem.Spec(testName)
	if diff := cmp.Diff([]int32{8443}, s.Proxy.AllowedPorts); diff != "" {
		t.Errorf("the instance's allowed ports after Update: -want, +got:\n%s", diff)
	}
	if string(got.ConnectionDetails[spec.ConnectionPort]) != "3128" {
		t.Errorf("connection details after Update: %v", got.ConnectionDetails)
	}
	if obs, err := e.Observe(context.Background(), cr); err != nil || !obs.ResourceUpToDate {
		t.Errorf("Observe after Update = up to date %v, %v; want up to date", obs.ResourceUpToDate, err)
	}

	mem.FailNext(proxytest.OpUpdate, proxy.Permanentf("not this resource's"))
	_, err = e.Update(context.Background(), cr)
	want := errors.New("cannot update the instance (permanent: will not succeed until the resource, its config or the backend changes): memory: update: not this resource's")
	if diff := cmp.Diff(errText(want), errText(err)); diff != "" {
		t.Errorf("Update(...): -want error, +got error:\n%s", diff)
	}
}

func TestDelete(t *testing.T) {
	cases := map[string]struct {
		fail    error
		wantErr error
	}{
		"Deleted": {},
		"Fails":   {fail: proxy.Transientf("busy"), wantErr: errors.New("cannot delete the instance (Transient, will retry): memory: delete: busy")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			mem := proxytest.NewMemory("memory", "proxytest-installation")
			e := newExternal(testKind(nil), mem, nil)
			ours(t, mem, e)
			if tc.fail != nil {
				mem.FailNext(proxytest.OpDelete, tc.fail)
			}
			_, err := e.Delete(context.Background(), proxyResource(deleting))
			if diff := cmp.Diff(errText(tc.wantErr), errText(err)); diff != "" {
				t.Errorf("Delete(...): -want error, +got error:\n%s", diff)
			}
			if _, stillThere := mem.Spec(testName); stillThere != (tc.fail != nil) {
				t.Errorf("instance still there: %v, want %v", stillThere, tc.fail != nil)
			}
		})
	}
}

func TestSetReadiness(t *testing.T) {
	cases := map[string]struct {
		inst proxy.Instance
		want xpv2.Condition
	}{
		"Answers": {inst: proxy.Instance{Name: "p", Mark: proxy.Mark{UID: testUID}, State: proxy.StateRunning, IP: "10.0.0.1", ProxyReachable: true}, want: xpv2.Available()},
		"AnswersUnmarked": {inst: proxy.Instance{Name: "p", State: proxy.StateRunning, IP: "10.0.0.1", ProxyReachable: true, Details: map[string]string{squid.DetailAnswer: `answered as "squid-1"`}},
			want: xpv2.Available().WithMessage(`instance p is not the provider's (it carries no ownership mark; imported Observe-only, so any Squid answering counts): its Squid answered as "squid-1"`)},
		"RunningNotAnswering": {inst: proxy.Instance{Name: "p", State: proxy.StateRunning, IP: "10.0.0.1"}, want: xpv2.Creating().WithMessage("instance p is running at 10.0.0.1; waiting for the proxy to answer")},
		"RunningNoAddress":    {inst: proxy.Instance{Name: "p", State: proxy.StateRunning}, want: xpv2.Creating()},
		"ProvisioningQuiet":   {inst: proxy.Instance{Name: "p", State: proxy.StateProvisioning}, want: xpv2.Creating()},
		"ProvisioningWithProgress": {inst: proxy.Instance{Name: "p", State: proxy.StateProvisioning, Progress: "downloading image (40%)"},
			want: xpv2.Creating().WithMessage("instance p is provisioning: downloading image (40%)")},
		"Stopped":    {inst: proxy.Instance{Name: "p", State: proxy.StateStopped}, want: xpv2.Unavailable().WithMessage("instance p is Stopped")},
		"Terminated": {inst: proxy.Instance{Name: "p", State: proxy.StateTerminated, Progress: "pod failed"}, want: xpv2.Unavailable().WithMessage("instance p is Terminated: pod failed")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cr := proxyResource()
			setReadiness(cr, tc.inst)
			if diff := cmp.Diff(tc.want.WithObservedGeneration(3), cr.GetCondition(xpv2.TypeReady), test.EquateConditions()); diff != "" {
				t.Errorf("Ready: -want, +got:\n%s", diff)
			}
		})
	}
}

// recorder records events.
type recorder struct{ reasons []string }

func (r *recorder) Event(_ runtime.Object, e event.Event) {
	r.reasons = append(r.reasons, string(e.Type)+" "+string(e.Reason))
}

func (r *recorder) WithAnnotations(...string) event.Recorder { return r }

// TestReadyEvents: a change of Ready's status or reason records one event
// (Normal when it becomes True), except the way into Creating from nothing.
func TestReadyEvents(t *testing.T) {
	running := proxy.Instance{Name: "p", State: proxy.StateRunning, IP: "10.0.0.1", ProxyReachable: true}
	stopped := proxy.Instance{Name: "p", State: proxy.StateStopped}
	booting := proxy.Instance{Name: "p", State: proxy.StateProvisioning}
	cases := map[string]struct {
		steps []proxy.Instance
		want  []string
	}{
		"FirstCreatingIsNoNews": {steps: []proxy.Instance{booting}},
		"BecomesReady":          {steps: []proxy.Instance{booting, running}, want: []string{"Normal Available"}},
		"SameStateTwice":        {steps: []proxy.Instance{booting, running, running}, want: []string{"Normal Available"}},
		"Stops":                 {steps: []proxy.Instance{running, stopped}, want: []string{"Normal Available", "Warning Unavailable"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := &recorder{}
			e := newExternal(testKind(nil), nil, nil)
			e.record = r
			cr := proxyResource()
			for _, inst := range tc.steps {
				e.setReadiness(cr, inst)
			}
			if diff := cmp.Diff(tc.want, r.reasons, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("events: -want, +got:\n%s", diff)
			}
		})
	}
}

func TestConnect(t *testing.T) {
	errBoom := errors.New("boom")
	kvmConfig := func(_ context.Context, _ client.ObjectKey, obj client.Object) error {
		pc, ok := obj.(*nsv1alpha1.ClusterProviderConfig)
		if !ok {
			return errors.Errorf("unexpected Get of %T", obj)
		}
		pc.Name = "home"
		pc.Spec.KVM = &spec.KVMConfig{}
		return nil
	}
	// What the API server answers a create in a namespace being deleted.
	terminating := kerrors.NewForbidden(schema.GroupResource{Group: "m.egressproxy.io", Resource: "providerconfigusages"}, "u-1",
		errors.New("unable to create new content in namespace team-a because it is being terminated"))
	terminating.ErrStatus.Details.Causes = append(terminating.ErrStatus.Details.Causes, metav1.StatusCause{Type: corev1.NamespaceTerminatingCause})
	mem := proxytest.NewMemory("memory", "proxytest-installation")
	kvmBackend := testKind(nil).Backend
	kvmBackend.Connect = func(context.Context, *Config) (proxy.Driver, error) { return mem, nil }
	cases := map[string]struct {
		reason   string
		get      test.MockGetFn
		track    error
		connect  func(context.Context, *Config) (proxy.Driver, error)
		backend  string
		deleting bool
		wantErr  error
	}{
		"Connected": {reason: "A config with the kind's block connects.", get: kvmConfig},
		"TrackFails": {
			reason: "The config's usage is tracked before anything else.",
			get:    kvmConfig, track: errBoom,
			wantErr: errors.Wrap(errBoom, "cannot track ProviderConfig usage"),
		},
		"OtherBackend": {
			reason: "A config holding another backend's block names both.", get: kvmConfig, backend: "proxmox",
			wantErr: errors.New("ClusterProviderConfig home holds a kvm block, but a KVMProxy needs a config with a proxmox block: point spec.providerConfigRef at one"),
		},
		"ConfigMissing": {
			reason:  "A config that does not exist says so.",
			get:     test.NewMockGetFn(kerrors.NewNotFound(schema.GroupResource{}, "home")),
			wantErr: errors.New(`ClusterProviderConfig "home" does not exist`),
		},
		"ConnectFails": {
			reason: "A driver that cannot be built names the backend and config.", get: kvmConfig,
			connect: func(context.Context, *Config) (proxy.Driver, error) { return nil, errBoom },
			wantErr: errors.Wrap(errBoom, "cannot connect to the kvm backend of ClusterProviderConfig home"),
		},
		"DeletingInATerminatingNamespace": {
			reason: "A resource being deleted goes on without its usage when its namespace, being deleted, refuses to make one.",
			get:    kvmConfig, track: errors.Wrap(terminating, "cannot apply ProviderConfigUsage"), deleting: true,
		},
		"TerminatingNamespaceStopsALiveResource": {
			reason: "A resource that is not being deleted is never used untracked.",
			get:    kvmConfig, track: terminating,
			wantErr: errors.Wrap(terminating, "cannot track ProviderConfig usage"),
		},
		"DeletingWithoutItsConfig": {
			reason:   "A resource being deleted whose config is gone says that its instance stays, and the ways out.",
			get:      test.NewMockGetFn(kerrors.NewNotFound(schema.GroupResource{}, "home")),
			deleting: true,
			wantErr: errors.Wrap(errors.New(`ClusterProviderConfig "home" does not exist`),
				"cannot delete the instance of web, which stays until it can: restore its config and the Secrets the config reads (or, to leave the instance on the backend, set this resource's spec.managementPolicies to [\"Observe\", \"Create\", \"Update\", \"LateInitialize\"]: its deletion then lets the instance go without deleting it, to the config's orphan sweep where a ClusterProviderConfig does not allowTenantRelease)"),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			k := testKind(nil)
			b := kvmBackend
			if tc.connect != nil {
				b.Connect = tc.connect
			}
			k.Backend = b
			if tc.backend != "" {
				k.Backend.Name = tc.backend
			}
			tracked := false
			c := &connector[spec.KVMProxyParameters]{
				kind:    k,
				configs: ConfigReader{Kube: &test.MockClient{MockGet: tc.get}, Backends: []Backend{kvmBackend}},
				modern: resource.ModernTrackerFn(func(context.Context, resource.ModernManaged) error {
					tracked = true
					return tc.track
				}),
				passwords: &Passwords{key: []byte("k")},
			}
			cr := proxyResource(func(cr *nsproxy.KVMProxy) {
				cr.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "home"})
				if tc.deleting {
					deleting(cr)
					// One that made an instance: one that never did is let
					// go without its config (connect_deleting_test.go).
					cr.Status.AtProvider.ID = "memory/" + testName
				}
			})
			ec, err := c.Connect(context.Background(), cr)
			if diff := cmp.Diff(errText(tc.wantErr), errText(err)); diff != "" {
				t.Errorf("\n%s\nConnect(...): -want error, +got error:\n%s", tc.reason, diff)
			}
			if !tracked {
				t.Errorf("\n%s\nthe config's usage was not tracked", tc.reason)
			}
			if tc.wantErr == nil && ec == nil {
				t.Errorf("\n%s\nConnect returned no client", tc.reason)
			}
		})
	}
}

// TestOperationSpans: each external-client operation is one span naming
// the kind, resource and config, the parent of the driver calls it makes
// (through telemetry.Instrument, as Connect wraps every driver), with the
// error's class as its status.
func TestOperationSpans(t *testing.T) {
	rec := otlptest.Record(t)

	mem := proxytest.NewMemory("memory", "proxytest-installation")
	e := newExternal(testKind(nil), telemetry.Instrument("kvm", mem), nil)
	if _, err := e.Observe(context.Background(), proxyResource()); err != nil {
		t.Fatal(err)
	}
	mem.FailNext(proxytest.OpDelete, proxy.Permanentf("refused"))
	if _, err := e.Delete(context.Background(), proxyResource(deleting)); err == nil {
		t.Fatal("Delete succeeded; want the driver's error")
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	for child, parent := range map[string]string{"kvm.Get": "egressproxy.Observe", "kvm.Delete": "egressproxy.Delete"} {
		c, p := spans[child], spans[parent]
		if c == nil || p == nil {
			t.Fatalf("spans %v; want %s and %s", rec.Ended(), child, parent)
		}
		if c.Parent().SpanID() != p.SpanContext().SpanID() {
			t.Errorf("%s is not a child of %s", child, parent)
		}
	}
	attrs := map[string]string{}
	for _, a := range spans["egressproxy.Observe"].Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	want := map[string]string{"egressproxy.kind": "KVMProxy", "k8s.namespace.name": "team-a", "egressproxy.resource": "web", "egressproxy.provider_config": "ClusterProviderConfig home"}
	if diff := cmp.Diff(want, attrs); diff != "" {
		t.Errorf("egressproxy.Observe attributes: -want, +got:\n%s", diff)
	}
	if d := spans["egressproxy.Delete"]; d.Status().Code != codes.Error || d.Status().Description != "permanent" {
		t.Errorf("egressproxy.Delete status %+v; want Error permanent", d.Status())
	}
}
