package health

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// events records the events of a reconcile.
type events struct{ got []string }

func (e *events) Event(_ runtime.Object, ev event.Event) {
	e.got = append(e.got, string(ev.Type)+" "+string(ev.Reason))
}
func (e *events) WithAnnotations(...string) event.Recorder { return e }

// patched is the status a reconcile patched, decoded.
type patched struct {
	Status spec.ProviderConfigStatus `json:"status"`
}

// kvmBackend is a backend on the kvm block whose driver is d, or whose
// Connect fails with err; insecure turns its Secure condition False.
func kvmBackend(d proxy.Driver, err error, insecure string) external.Backend {
	return external.Backend{
		Name: "kvm",
		Block: func(s *spec.ProviderConfigSpec) (external.Block, bool) {
			return external.Block{Insecure: insecure}, s.KVM != nil
		},
		Connect: func(context.Context, *external.Config) (proxy.Driver, error) { return d, err },
	}
}

// unhealthy is a driver whose check reports one bad target.
type unhealthy struct{ proxy.Driver }

func (unhealthy) Check(context.Context) proxy.Health {
	return proxy.Health{Targets: []proxy.TargetHealth{
		{Target: "host-a", Healthy: true},
		{Target: "host-b", Reason: proxy.ReasonUnreachable, Message: "dial tcp: i/o timeout"},
	}}
}

func TestReconcile(t *testing.T) {
	mem := proxytest.NewMemory("memory", "inst")
	errBoom := errors.New("boom")
	type want struct {
		err     error
		patched bool
		healthy xpv2.Condition
		secure  corev1.ConditionStatus
		targets []spec.TargetHealth
		backend string
		events  []string
	}
	// allHealthy is the outcome for a config whose one target (the memory
	// driver) is healthy, with Secure secure and events.
	allHealthy := func(secure corev1.ConditionStatus, events ...string) want {
		return want{patched: true, backend: "kvm", secure: secure,
			healthy: xpv2.Condition{Type: TypeHealthy, Status: corev1.ConditionTrue, Reason: ReasonHealthy, Message: "1 of 1 targets healthy"},
			targets: []spec.TargetHealth{{Target: "memory", Address: "memory://memory", Healthy: true}},
			events:  events}
	}
	// notConnected is the outcome for a config whose driver cannot be
	// built: one target, the backend, saying why (targetReason: msg),
	// Healthy False with reason and a Warning event of that reason.
	notConnected := func(reason xpv2.ConditionReason, targetReason, msg string) want {
		return want{patched: true, backend: "kvm", secure: corev1.ConditionTrue,
			healthy: xpv2.Condition{Type: TypeHealthy, Status: corev1.ConditionFalse, Reason: reason, Message: "kvm: " + targetReason + ": " + msg},
			targets: []spec.TargetHealth{{Target: "kvm", Reason: targetReason, Message: msg}},
			events:  []string{"Warning " + string(reason)}}
	}
	cases := map[string]struct {
		reason  string
		config  *nsv1alpha1.ClusterProviderConfig
		getErr  error
		patch   error
		backend external.Backend
		want    want
	}{
		"Healthy": {
			reason:  "Every target healthy: Healthy True, one event, the status patched.",
			backend: kvmBackend(mem, nil, ""),
			want:    allHealthy(corev1.ConditionTrue, "Normal Healthy"),
		},
		"Unhealthy": {
			reason:  "A bad target makes Healthy False, naming the target, reason and message.",
			backend: kvmBackend(unhealthy{mem}, nil, ""),
			want: want{patched: true, backend: "kvm", secure: corev1.ConditionTrue,
				healthy: xpv2.Condition{Type: TypeHealthy, Status: corev1.ConditionFalse, Reason: ReasonUnhealthy, Message: "host-b: Unreachable: dial tcp: i/o timeout"},
				targets: []spec.TargetHealth{{Target: "host-a", Healthy: true}, {Target: "host-b", Reason: proxy.ReasonUnreachable, Message: "dial tcp: i/o timeout"}},
				events:  []string{"Warning Unhealthy"}},
		},
		"CannotConnect": {
			reason:  "A driver that cannot be built is one target saying why: CannotConnect.",
			backend: kvmBackend(nil, proxy.Permanentf("the config has no hosts"), ""),
			want:    notConnected(ReasonCannotConnect, proxy.ReasonNotAvailable, "the config has no hosts"),
		},
		"CredentialsUnavailable": {
			reason:  "A Transient Connect error (a Secret not readable yet) is CredentialsUnavailable.",
			backend: kvmBackend(nil, proxy.Transientf("Secret ssh not found"), ""),
			want:    notConnected(ReasonUnhealthy, proxy.ReasonCredentialsUnavailable, "Secret ssh not found"),
		},
		"Insecure": {
			reason:  "A block that turns verification off makes Secure False, with an event.",
			backend: kvmBackend(mem, nil, "kvm.credentials.insecureIgnoreHostKey is true"),
			want:    allHealthy(corev1.ConditionFalse, "Normal Healthy", "Warning VerificationOff"),
		},
		"NoBackend": {
			reason:  "A config whose block this build has no backend for says so.",
			backend: external.Backend{Name: "gcp", Block: func(*spec.ProviderConfigSpec) (external.Block, bool) { return external.Block{}, false }},
			want:    notConnected(ReasonCannotConnect, proxy.ReasonNotAvailable, "the kvm backend is not available in this build of provider-egressproxy"),
		},
		"Gone": {
			reason:  "A config that is gone is not checked and nothing is written.",
			getErr:  kerrors.NewNotFound(schema.GroupResource{}, "home"),
			backend: kvmBackend(mem, nil, ""),
			want:    want{},
		},
		"Deleting": {
			reason: "A config being deleted is not checked.",
			config: func() *nsv1alpha1.ClusterProviderConfig {
				pc := &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home", DeletionTimestamp: &metav1.Time{}, Finalizers: []string{"f"}}}
				pc.Spec.KVM = &spec.KVMConfig{}
				return pc
			}(),
			backend: kvmBackend(mem, nil, ""),
			want:    want{},
		},
		"PatchFails": {
			reason:  "A status write that fails is returned, to be retried.",
			patch:   errBoom,
			backend: kvmBackend(mem, nil, ""),
			want:    want{err: errors.Wrap(errBoom, "cannot update the config's status"), patched: true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var body []byte
			kube := &test.MockClient{
				MockGet: func(_ context.Context, _ client.ObjectKey, obj client.Object) error {
					if tc.getErr != nil {
						return tc.getErr
					}
					pc := obj.(*nsv1alpha1.ClusterProviderConfig) //nolint:forcetypeassert // The reconciler reads its kind.
					if tc.config != nil {
						tc.config.DeepCopyInto(pc)
						return nil
					}
					pc.Name = "home"
					pc.Spec.KVM = &spec.KVMConfig{}
					return nil
				},
				MockStatusPatch: func(_ context.Context, obj client.Object, p client.Patch, _ ...client.SubResourcePatchOption) error {
					if p.Type() != types.MergePatchType {
						t.Errorf("status patch of type %s; want a merge patch (no resourceVersion, no conflict)", p.Type())
					}
					body, _ = p.Data(obj)
					return tc.patch
				},
				MockStatusUpdate: func(context.Context, client.Object, ...client.SubResourceUpdateOption) error {
					t.Error("status written by Update, which conflicts with the other writers of a config's status")
					return nil
				},
			}
			ev := &events{}
			r := &Reconciler{
				Kube:      kube,
				Configs:   external.ConfigReader{Kube: kube, InstallationID: "inst", Backends: []external.Backend{tc.backend}},
				Interval:  time.Minute,
				Timeout:   10 * time.Second,
				Log:       logging.NewNopLogger(),
				Events:    ev,
				kind:      "ClusterProviderConfig",
				newConfig: func() config { return &nsv1alpha1.ClusterProviderConfig{} },
				status:    statusOf,
			}
			got, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "home"}})
			if diff := cmp.Diff(tc.want.err, err, test.EquateErrors()); diff != "" {
				t.Fatalf("\n%s\nReconcile(...): -want error, +got error:\n%s", tc.reason, diff)
			}
			if (body != nil) != tc.want.patched {
				t.Fatalf("\n%s\nstatus patched: %v, want %v", tc.reason, body != nil, tc.want.patched)
			}
			if !tc.want.patched || tc.want.err != nil {
				if got != (reconcile.Result{}) {
					t.Errorf("\n%s\nReconcile(...) = %+v, want no requeue", tc.reason, got)
				}
				return
			}
			if got.RequeueAfter < 54*time.Second || got.RequeueAfter > 66*time.Second {
				t.Errorf("\n%s\nrequeue after %v; want the interval give or take 10%%", tc.reason, got.RequeueAfter)
			}
			var p patched
			if err := json.Unmarshal(body, &p); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want.healthy, p.Status.GetCondition(TypeHealthy), test.EquateConditions()); diff != "" {
				t.Errorf("\n%s\nHealthy: -want, +got:\n%s", tc.reason, diff)
			}
			if got := p.Status.GetCondition(TypeSecure).Status; got != tc.want.secure {
				t.Errorf("\n%s\nSecure %s, want %s", tc.reason, got, tc.want.secure)
			}
			if diff := cmp.Diff(tc.want.targets, p.Status.Targets, cmpopts.EquateEmpty(), cmpopts.IgnoreFields(spec.TargetHealth{}, "Details")); diff != "" {
				t.Errorf("\n%s\ntargets: -want, +got:\n%s", tc.reason, diff)
			}
			if p.Status.Backend != tc.want.backend || p.Status.InstallationID != "inst" || p.Status.LastCheckTime == nil {
				t.Errorf("\n%s\nbackend %q, installationID %q, lastCheckTime %v; want %q, inst, set", tc.reason, p.Status.Backend, p.Status.InstallationID, p.Status.LastCheckTime, tc.want.backend)
			}
			if diff := cmp.Diff(tc.want.events, ev.got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("\n%s\nevents: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

// TestStatusPatchCarriesEmptyFields: a target gone since the last check leaves
// the status: the patch carries the whole list, and an empty one too.
func TestStatusPatchCarriesEmptyFields(t *testing.T) {
	var body []byte
	kube := &test.MockClient{MockStatusPatch: func(_ context.Context, obj client.Object, p client.Patch, _ ...client.SubResourcePatchOption) error {
		body, _ = p.Data(obj)
		return nil
	}}
	r := &Reconciler{Kube: kube}
	if err := r.writeStatus(context.Background(), &nsv1alpha1.ClusterProviderConfig{}, &spec.ProviderConfigStatus{Targets: []spec.TargetHealth{}}); err != nil {
		t.Fatal(err)
	}
	want := `{"status":{"backend":"","conditions":null,"installationID":"","lastCheckTime":null,"targets":[]}}`
	if diff := cmp.Diff(want, string(body)); diff != "" {
		t.Errorf("status patch: -want, +got:\n%s", diff)
	}
}

// TestTheProxiesWatchTheHealthyCondition: the proxy controllers queue a
// config's failing resources when this package's condition turns True,
// under a name of their own (they cannot import this package).
func TestTheProxiesWatchTheHealthyCondition(t *testing.T) {
	if external.TypeConfigHealthy != TypeHealthy {
		t.Errorf("the proxies watch %q, the check sets %q", external.TypeConfigHealthy, TypeHealthy)
	}
}

// TestStalledNamespaceLeavesTheCheckWorkers: while two checks of a
// tenant's configs stall, the tenant's other configs wait their turn,
// holding no worker, and another tenant's config is checked.
func TestStalledNamespaceLeavesTheCheckWorkers(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
	var written []string
	kube := &test.MockClient{
		MockGet: func(_ context.Context, key client.ObjectKey, obj client.Object) error {
			pc := obj.(*nsv1alpha1.ProviderConfig) //nolint:forcetypeassert // The reconciler reads its kind.
			pc.Namespace, pc.Name = key.Namespace, key.Name
			pc.Spec.KVM = &spec.KVMConfig{}
			return nil
		},
		MockStatusPatch: func(_ context.Context, obj client.Object, _ client.Patch, _ ...client.SubResourcePatchOption) error {
			written = append(written, obj.GetNamespace()+"/"+obj.GetName())
			return nil
		},
	}
	r := &Reconciler{
		Kube:      kube,
		Configs:   external.ConfigReader{Kube: kube, InstallationID: "inst", Backends: []external.Backend{kvmBackend(proxytest.NewMemory("memory", "inst"), nil, "")}},
		Interval:  time.Minute,
		Timeout:   30 * time.Second,
		Log:       logging.NewNopLogger(),
		Events:    &events{},
		kind:      "ProviderConfig",
		newConfig: func() config { return &nsv1alpha1.ProviderConfig{} },
		status:    statusOf,
		stalls:    external.NewCheckGuard(DefaultWorkers/4, clk),
	}
	for _, name := range []string{"silent-1", "silent-2"} {
		end, err := r.stalls.Enter(&external.Config{Name: "ProviderConfig team-a/" + name, Namespaced: true}, "team-a")
		if err != nil {
			t.Fatal(err)
		}
		defer end()
	}
	clk.Step(5 * time.Second)

	for _, nn := range []types.NamespacedName{{Namespace: "team-a", Name: "pve"}, {Namespace: "team-b", Name: "pve"}} {
		got, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: nn})
		if err != nil {
			t.Fatalf("check of %s: %v", nn, err)
		}
		if nn.Namespace == "team-a" && (got.RequeueAfter < 27*time.Second || got.RequeueAfter > 33*time.Second) {
			t.Errorf("the deferred check of %s requeues after %s, want about the 30s check timeout", nn, got.RequeueAfter)
		}
	}
	if diff := cmp.Diff([]string{"team-b/pve"}, written); diff != "" {
		t.Errorf("configs checked while team-a's checks stall: -want, +got:\n%s", diff)
	}
}
