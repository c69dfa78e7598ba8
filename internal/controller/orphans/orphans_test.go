package orphans

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

const installation = "inst-1"

type recorded struct {
	mu     sync.Mutex
	events []event.Event
}

func (r *recorded) Event(_ runtime.Object, e event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}
func (r *recorded) WithAnnotations(...string) event.Recorder { return r }

func (r *recorded) reasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, string(e.Reason))
	}
	return out
}

type setup struct {
	sweeper *Sweeper
	kube    client.Client
	backend *proxytest.Memory
	events  *recorded
	uids    map[string]string // instance name -> UID
}

// newSetup makes a ClusterProviderConfig "home" of the kvm backend on a
// fake API server holding a live KVMProxy of each scope, and an in-memory
// backend holding: an instance of each live proxy, an orphan created 3h
// before the sweep, one created 90m before, one created a minute before,
// one of another installation and one unmarked. policy configures the
// config's spec.orphans.
func newSetup(t *testing.T, policy *spec.OrphanPolicy, kinds []schema.GroupVersionKind) *setup {
	t.Helper()
	s := testenv.Scheme(t)
	pc := &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home", Generation: 1}}
	pc.Spec.KVM = &spec.KVMConfig{}
	pc.Spec.Orphans = policy
	nsLive := &nsproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "live", UID: "uid-ns-live"}}
	clLive := &clusterproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Name: "live", UID: "uid-cl-live"}}
	kube := fake.NewClientBuilder().WithScheme(s).WithObjects(pc, nsLive, clLive).WithStatusSubresource(pc).
		WithInterceptorFuncs(interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			// What the API server (and the manager's cache) answer for a
			// kind whose CRD is not installed or not yet activated.
			if gvk := l.GetObjectKind().GroupVersionKind(); gvk.Kind == notActivated.Kind+"List" {
				return &apimeta.NoKindMatchError{GroupKind: notActivated.GroupKind(), SearchedVersions: []string{gvk.Version}}
			}
			return c.List(ctx, l, opts...)
		}}).Build()

	m := proxytest.NewMemory("ClusterProviderConfig home", installation)
	ctx := context.Background()
	st := &setup{kube: kube, backend: m, events: &recorded{}, uids: map[string]string{}}
	create := func(name, uid, inst string) {
		req := m.Request(name, uid)
		req.Mark.InstallationID = inst
		if _, err := m.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
		st.uids[name] = uid
	}
	create("ns-live", "uid-ns-live", installation)
	create("cl-live", "uid-cl-live", installation)
	create("other-installation", "uid-gone-x", "inst-2")
	if err := m.Foreign("unmarked"); err != nil {
		t.Fatal(err)
	}
	// Instances are created "now"; the sweep's clock runs ahead of them.
	created := time.Now()
	create("gone-3h", "uid-gone-1", installation)
	st.sweeper = &Sweeper{
		Kube: kube,
		Configs: external.ConfigReader{Kube: kube, InstallationID: installation, Backends: []external.Backend{{
			Name:    "kvm",
			Block:   func(s *spec.ProviderConfigSpec) (external.Block, bool) { return external.Block{}, s.KVM != nil },
			Connect: func(context.Context, *external.Config) (proxy.Driver, error) { return m, nil },
		}}},
		Kinds:     map[string][]schema.GroupVersionKind{"kvm": kinds},
		Interval:  time.Hour,
		Log:       logging.NewNopLogger(),
		Events:    st.events,
		kind:      "ClusterProviderConfig",
		newConfig: func() config { return &nsv1alpha1.ClusterProviderConfig{} },
		now:       func() time.Time { return created.Add(3 * time.Hour) },
	}
	return st
}

var notActivated = schema.GroupVersionKind{Group: "proxy.m.egressproxy.io", Version: "v1alpha1", Kind: "NotActivated"}

var bothScopes = []schema.GroupVersionKind{nsproxy.KVMProxyGroupVersionKind, clusterproxy.KVMProxyGroupVersionKind}

func (st *setup) sweep(t *testing.T) *spec.OrphanStatus {
	t.Helper()
	if _, err := st.sweeper.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "home"}}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	pc := &nsv1alpha1.ClusterProviderConfig{}
	if err := st.kube.Get(context.Background(), types.NamespacedName{Name: "home"}, pc); err != nil {
		t.Fatal(err)
	}
	return pc.Status.Orphans
}

func (st *setup) names() []string {
	var out []string
	for _, i := range st.backend.Instances() {
		out = append(out, i.Name)
	}
	return out
}

func orphanNames(o *spec.OrphanStatus) []string {
	if o == nil {
		return nil
	}
	var out []string
	for _, i := range o.Instances {
		out = append(out, i.Name+"="+i.UID)
	}
	return out
}

func TestSweepReportsOnlyThisInstallationsOrphans(t *testing.T) {
	st := newSetup(t, nil, bothScopes)
	before := st.names()
	got := st.sweep(t)
	if got == nil || got.Count != 1 || got.LastSweepTime == nil {
		t.Fatalf("status.orphans = %+v, want one orphan and a sweep time", got)
	}
	if diff := cmp.Diff([]string{"gone-3h=uid-gone-1"}, orphanNames(got)); diff != "" {
		t.Errorf("orphans (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, st.names()); diff != "" {
		t.Errorf("a report-only sweep changed the backend (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff([]string{string(ReasonOrphansFound)}, st.events.reasons()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if v := testutil.ToFloat64(telemetry.Orphans.WithLabelValues("kvm", "ClusterProviderConfig/home")); v != 1 {
		t.Errorf("egressproxy_orphans = %v, want 1", v)
	}
	// The same orphans again: no second event.
	st.sweep(t)
	if n := len(st.events.reasons()); n != 1 {
		t.Errorf("a second sweep with the same orphans recorded %d events in all, want 1", n)
	}
}

func TestSweepDeletesOnlyOrphansOlderThanMinAge(t *testing.T) {
	for name, tc := range map[string]struct {
		minAge      time.Duration
		wantDeleted bool
	}{
		"OlderThanMinAge":   {minAge: time.Hour, wantDeleted: true},
		"YoungerThanMinAge": {minAge: 4 * time.Hour, wantDeleted: false},
	} {
		t.Run(name, func(t *testing.T) {
			st := newSetup(t, &spec.OrphanPolicy{Policy: spec.OrphanPolicyDelete, MinAge: &metav1.Duration{Duration: tc.minAge}}, bothScopes)
			got := st.sweep(t)
			left := strings.Join(st.names(), " ")
			if deleted := !strings.Contains(left, "gone-3h"); deleted != tc.wantDeleted {
				t.Errorf("orphan deleted = %v, want %v (backend holds %s)", deleted, tc.wantDeleted, left)
			}
			for _, keep := range []string{"ns-live", "cl-live", "other-installation", "unmarked"} {
				if !strings.Contains(left, keep) {
					t.Errorf("the sweep deleted %s, which is not an orphan of this installation (backend holds %s)", keep, left)
				}
			}
			wantCount := int32(1)
			if tc.wantDeleted {
				wantCount = 0
				if !strings.Contains(strings.Join(st.events.reasons(), " "), string(ReasonOrphanDeleted)) {
					t.Errorf("events %v, want %s", st.events.reasons(), ReasonOrphanDeleted)
				}
			}
			if got == nil || got.Count != wantCount {
				t.Errorf("status.orphans = %+v, want count %d", got, wantCount)
			}
		})
	}
}

// A kind that cannot be listed (not activated under safe start, no
// permission) would make every instance of its resources look orphaned;
// the sweep must call nothing an orphan then.
func TestSweepThatCannotListResourcesReportsNothing(t *testing.T) {
	st := newSetup(t, &spec.OrphanPolicy{Policy: spec.OrphanPolicyDelete}, append(bothScopes, notActivated))
	before := st.names()
	if got := st.sweep(t); got != nil {
		t.Errorf("status.orphans = %+v, want none written", got)
	}
	if diff := cmp.Diff(before, st.names()); diff != "" {
		t.Errorf("a sweep that could not list resources changed the backend (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff([]string{string(ReasonCannotSweep)}, st.events.reasons()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// partialMarks is the backend with, in its List, pieces marked in part
// (a UID prefix, as Proxmox seed ISOs are): one of a live resource's UID
// and one of no resource's. It records every Delete.
type partialMarks struct {
	*proxytest.Memory
	deleted []string
}

func (p *partialMarks) List(ctx context.Context, id string) ([]proxy.Instance, error) {
	l, err := p.Memory.List(ctx, id)
	for name, prefix := range map[string]string{"seed-live": "uidnsli", "seed-gone": "uidgone9"} {
		l = append(l, proxy.Instance{ID: "isos/" + name, Name: name, Leftovers: []string{name + ".iso"},
			Details: map[string]string{proxy.DetailUIDPrefix: prefix}})
	}
	return l, err
}

func (p *partialMarks) Delete(ctx context.Context, ref proxy.Ref) error {
	p.deleted = append(p.deleted, ref.ID)
	return p.Memory.Delete(ctx, ref)
}

// What a create cut short left, or a deletion that was bypassed left,
// without its instance is an orphan once its resource is gone: reported
// with its pieces named, deleted only under Delete, and only with the
// full mark of this installation; pieces marked in part only reported.
func TestSweepFindsLeftoversWithoutAnInstance(t *testing.T) {
	for _, policy := range []string{spec.OrphanPolicyReport, spec.OrphanPolicyDelete} {
		t.Run(policy, func(t *testing.T) {
			st := newSetup(t, &spec.OrphanPolicy{Policy: policy, MinAge: &metav1.Duration{Duration: time.Hour}}, bothScopes)
			for name, uid := range map[string]string{"left-gone": "uid-gone-2", "left-live": "uid-cl-live"} {
				if err := st.backend.PartialCreate(name, uid); err != nil {
					t.Fatal(err)
				}
			}
			pm := &partialMarks{Memory: st.backend}
			st.sweeper.Configs.Backends[0].Connect = func(context.Context, *external.Config) (proxy.Driver, error) { return pm, nil }
			got := st.sweep(t)
			byName := map[string]spec.OrphanInstance{}
			for _, o := range got.Instances {
				byName[o.Name] = o
			}
			if _, ok := byName["left-live"]; ok {
				t.Errorf("the leftovers of a live resource are reported as an orphan: %+v", got.Instances)
			}
			if _, ok := byName["seed-live"]; ok {
				t.Errorf("pieces whose UID prefix is a live resource's are reported as an orphan: %+v", got.Instances)
			}
			if o, ok := byName["seed-gone"]; !ok || o.UIDPrefix != "uidgone9" || o.UID != "" || len(o.Leftovers) != 1 {
				t.Errorf("pieces marked in part of no resource: reported as %+v (%v); want the prefix and the pieces", o, ok)
			}
			o, reported := byName["left-gone"]
			if policy == spec.OrphanPolicyReport {
				if !reported || o.UID != "uid-gone-2" || len(o.Leftovers) == 0 {
					t.Errorf("leftovers of a gone resource: reported as %+v (%v); want its UID and its pieces", o, reported)
				}
				if len(st.backend.Leftovers("left-gone")) == 0 {
					t.Error("a report-only sweep deleted the leftovers")
				}
			} else {
				if reported || len(st.backend.Leftovers("left-gone")) != 0 {
					t.Errorf("leftovers of a gone resource under Delete: still there (%v, reported %v)", st.backend.Leftovers("left-gone"), reported)
				}
				if len(st.backend.Leftovers("left-live")) == 0 {
					t.Error("the sweep deleted the leftovers of a live resource")
				}
			}
			for _, id := range pm.deleted {
				if strings.HasPrefix(id, "isos/") {
					t.Errorf("the sweep deleted %s, which carries no full mark", id)
				}
			}
		})
	}
}

// A host that leaves the config is reported with what stood on it when
// the sweep last listed it: status.orphans.departedHosts and one
// HostLeftConfig event; it stays reported until it is back in the config.
func TestSweepReportsHostsThatLeftTheConfig(t *testing.T) {
	st := newSetup(t, nil, bothScopes)
	ctx := context.Background()
	st.sweeper.Configs.Backends[0].Block = func(s *spec.ProviderConfigSpec) (external.Block, bool) {
		if s.KVM == nil {
			return external.Block{}, false
		}
		b := external.Block{Hosts: map[string]string{}}
		for _, h := range s.KVM.Hosts {
			b.Hosts[h.Name] = h.Address
		}
		return b, true
	}
	setHosts := func(names ...string) {
		pc := &nsv1alpha1.ClusterProviderConfig{}
		if err := st.kube.Get(ctx, types.NamespacedName{Name: "home"}, pc); err != nil {
			t.Fatal(err)
		}
		pc.Spec.KVM.Hosts = nil
		for _, n := range names {
			pc.Spec.KVM.Hosts = append(pc.Spec.KVM.Hosts, spec.KVMHost{Name: n, Address: n + ".lab:22"})
		}
		if err := st.kube.Update(ctx, pc); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"b-one", "b-two"} {
		req := st.backend.Request(n, "uid-"+n)
		req.Placement.Location = "beelink"
		if _, err := st.backend.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	setHosts("local", "beelink")
	got := st.sweep(t)
	if len(got.Hosts) != 2 || got.Hosts[0].Name != "beelink" || got.Hosts[0].Count != 2 || got.Hosts[0].Address != "beelink.lab:22" || len(got.DepartedHosts) != 0 {
		t.Fatalf("status.orphans hosts %+v, departed %+v; want beelink with its two instances, nothing departed", got.Hosts, got.DepartedHosts)
	}

	setHosts("local")
	got = st.sweep(t)
	d := got.DepartedHosts
	if len(d) != 1 || d[0].Name != "beelink" || d[0].Count != 2 || !slices.Equal(d[0].Instances, []string{"b-one", "b-two"}) || d[0].DepartedTime == nil || d[0].LastListedTime == nil {
		t.Fatalf("departed hosts %+v; want beelink with b-one and b-two, when it left and when it was last listed", d)
	}
	if len(got.Hosts) != 1 || got.Hosts[0].Name != "local" {
		t.Errorf("hosts %+v; want local alone", got.Hosts)
	}
	count := func() int { return strings.Count(strings.Join(st.events.reasons(), " "), string(ReasonHostDeparted)) }
	if count() != 1 {
		t.Errorf("events %v; want one %s", st.events.reasons(), ReasonHostDeparted)
	}
	if got = st.sweep(t); len(got.DepartedHosts) != 1 || count() != 1 {
		t.Errorf("a second sweep: departed %+v, %d events; want it still reported, no second event", got.DepartedHosts, count())
	}

	setHosts("local", "beelink")
	if got = st.sweep(t); len(got.DepartedHosts) != 0 {
		t.Errorf("departed hosts once beelink is back: %+v; want none", got.DepartedHosts)
	}
}

// tidier is the backend with shared pieces to tidy.
type tidier struct {
	*proxytest.Memory
	calls int
}

func (t *tidier) Tidy(context.Context) ([]string, error) {
	t.calls++
	return []string{"base image egressproxy-base-x in pool default on host lab"}, nil
}

// The sweep tidies a backend that keeps shared pieces (proxy.Tidier),
// whatever the orphan policy, and records each deletion as an event.
func TestSweepTidies(t *testing.T) {
	st := newSetup(t, nil, bothScopes)
	td := &tidier{Memory: st.backend}
	st.sweeper.Configs.Backends[0].Connect = func(context.Context, *external.Config) (proxy.Driver, error) { return td, nil }
	st.sweep(t)
	if td.calls != 1 || !strings.Contains(strings.Join(st.events.reasons(), " "), string(ReasonTidied)) {
		t.Errorf("Tidy called %d times, events %v; want once, and %s", td.calls, st.events.reasons(), ReasonTidied)
	}
}

// A namespaced ProviderConfig with a setting only the platform team may
// make (stored before admission refused it) is not connected with: the
// sweep reports why, as any sweep that cannot run, and writes nothing.
func TestSweepDoesNotConnectWithAConfigTenantsMayNotWrite(t *testing.T) {
	injected := xpv2.CredentialsSourceInjectedIdentity
	for name, block := range map[string]external.Block{
		"InjectedIdentity": {CredentialsSource: &injected},
		"ClusterOnly":      {ClusterOnly: "kvm.example is not allowed on a namespaced ProviderConfig"},
	} {
		t.Run(name, func(t *testing.T) {
			st := newSetup(t, nil, bothScopes)
			pc := &nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "home", Generation: 1}}
			pc.Spec.KVM = &spec.KVMConfig{}
			if err := st.kube.Create(context.Background(), pc); err != nil {
				t.Fatal(err)
			}
			connected := false
			b := &st.sweeper.Configs.Backends[0]
			b.Block = func(s *spec.ProviderConfigSpec) (external.Block, bool) { return block, s.KVM != nil }
			b.Connect = func(context.Context, *external.Config) (proxy.Driver, error) {
				connected = true
				return st.backend, nil
			}
			st.sweeper.kind, st.sweeper.newConfig = "ProviderConfig", func() config { return &nsv1alpha1.ProviderConfig{} }

			nn := types.NamespacedName{Namespace: "team-a", Name: "home"}
			if _, err := st.sweeper.Reconcile(context.Background(), reconcile.Request{NamespacedName: nn}); err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
			if connected {
				t.Error("the sweep connected to the backend with the config")
			}
			if diff := cmp.Diff([]string{string(ReasonCannotSweep)}, st.events.reasons()); diff != "" {
				t.Fatalf("events (-want +got):\n%s", diff)
			}
			if msg := st.events.events[0].Message; !strings.Contains(msg, "ProviderConfig team-a/home: ") || !strings.Contains(msg, "is not allowed on a namespaced ProviderConfig") {
				t.Errorf("event message %q; want the config and the setting not allowed", msg)
			}
			if err := st.kube.Get(context.Background(), nn, pc); err != nil {
				t.Fatal(err)
			}
			if pc.Status.Orphans != nil {
				t.Errorf("status.orphans = %+v, want none written", pc.Status.Orphans)
			}
		})
	}
}

// release records uid in status.released of the config "home", released
// at at; unrecorded, when not zero, sets unrecordedTime.
func (st *setup) release(t *testing.T, at, unrecorded time.Time, uids ...string) {
	t.Helper()
	ctx := context.Background()
	pc := &nsv1alpha1.ClusterProviderConfig{}
	if err := st.kube.Get(ctx, types.NamespacedName{Name: "home"}, pc); err != nil {
		t.Fatal(err)
	}
	pc.Status.Released = &spec.ReleasedStatus{}
	for _, uid := range uids {
		pc.Status.Released.Instances = append(pc.Status.Released.Instances, spec.ReleasedInstance{UID: uid, ReleasedAt: metav1.NewTime(at)})
	}
	if !unrecorded.IsZero() {
		u := metav1.NewTime(unrecorded)
		pc.Status.Released.UnrecordedTime = &u
	}
	if err := st.kube.Status().Update(ctx, pc); err != nil {
		t.Fatal(err)
	}
}

func (st *setup) released(t *testing.T) *spec.ReleasedStatus {
	t.Helper()
	pc := &nsv1alpha1.ClusterProviderConfig{}
	if err := st.kube.Get(context.Background(), types.NamespacedName{Name: "home"}, pc); err != nil {
		t.Fatal(err)
	}
	return pc.Status.Released
}

func (st *setup) remove(t *testing.T, name string) {
	t.Helper()
	for _, i := range st.backend.Instances() {
		if i.Name == name {
			st.backend.Remove(i.ID)
			return
		}
	}
	t.Fatalf("no instance %s", name)
}

// An instance whose resource was deleted with deletionPolicy Orphan or
// management policies without Delete is recorded in status.released: the
// sweep never deletes it, under policy Delete, nor calls it an orphan; it
// counts it in status.orphans.released. An orphan no one released is still
// deleted. Once the released instance is deleted by hand, its entry goes.
func TestSweepNeverDeletesReleasedInstances(t *testing.T) {
	st := newSetup(t, &spec.OrphanPolicy{Policy: spec.OrphanPolicyDelete, MinAge: &metav1.Duration{Duration: time.Hour}}, bothScopes)
	req := st.backend.Request("gone-unreleased", "uid-gone-3")
	req.Mark.InstallationID = installation
	if _, err := st.backend.Create(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	now := st.sweeper.clock()
	// Released long ago (its instance is older still), and a release just
	// made whose instance is not listed yet.
	st.release(t, now.Add(-2*time.Hour), time.Time{}, "uid-gone-1")
	rel := st.released(t)
	rel.Instances = append(rel.Instances, spec.ReleasedInstance{UID: "uid-creating", ReleasedAt: metav1.NewTime(now.Add(-time.Minute))})
	st.setReleased(t, rel)

	got := st.sweep(t)
	left := strings.Join(st.names(), " ")
	if !strings.Contains(left, "gone-3h") {
		t.Fatalf("the sweep deleted the instance its resource left on purpose (backend holds %s)", left)
	}
	if strings.Contains(left, "gone-unreleased") {
		t.Errorf("the sweep kept an orphan no one released (backend holds %s)", left)
	}
	if got == nil || got.Count != 0 || got.Released != 1 || len(got.Instances) != 0 {
		t.Errorf("status.orphans = %+v, want no orphan and one released instance", got)
	}
	if v := testutil.ToFloat64(telemetry.Orphans.WithLabelValues("kvm", "ClusterProviderConfig/home")); v != 0 {
		t.Errorf("egressproxy_orphans = %v, want 0", v)
	}
	if diff := cmp.Diff([]string{"uid-gone-1", "uid-creating"}, releasedUIDs(st.released(t))); diff != "" {
		t.Errorf("status.released while the instance stands (-want +got):\n%s", diff)
	}
	for _, r := range st.events.reasons() {
		if r == string(ReasonOrphansFound) {
			t.Errorf("events %v: a released instance was reported as an orphan", st.events.reasons())
		}
	}

	// Deleted by hand: its entry goes; the recent one stays until an
	// hour has passed.
	st.remove(t, "gone-3h")
	got = st.sweep(t)
	if got.Released != 0 || got.Count != 0 {
		t.Errorf("status.orphans = %+v, want nothing released or orphaned", got)
	}
	if diff := cmp.Diff([]string{"uid-creating"}, releasedUIDs(st.released(t))); diff != "" {
		t.Errorf("status.released once the instance is gone (-want +got):\n%s", diff)
	}
	st.sweeper.now = func() time.Time { return now.Add(time.Hour) }
	st.sweep(t)
	if r := st.released(t); r != nil {
		t.Errorf("status.released = %+v, want none once no instance carries its UIDs", r)
	}
}

// A tenant's release on the platform's config (its namespace recorded)
// keeps its instance only while the config allows tenants' releases: once
// allowTenantRelease is off, the instance is an orphan like any other,
// deleted under policy Delete.
func TestSweepHonoursATenantReleaseOnlyWhileAllowed(t *testing.T) {
	st := newSetup(t, &spec.OrphanPolicy{Policy: spec.OrphanPolicyDelete, MinAge: &metav1.Duration{Duration: time.Hour}}, bothScopes)
	now := st.sweeper.clock()
	st.setReleased(t, &spec.ReleasedStatus{Instances: []spec.ReleasedInstance{{UID: "uid-gone-1", ReleasedAt: metav1.NewTime(now.Add(-2 * time.Hour)), Namespace: "team-b"}}})
	allow := func(v bool) {
		pc := &nsv1alpha1.ClusterProviderConfig{}
		if err := st.kube.Get(context.Background(), types.NamespacedName{Name: "home"}, pc); err != nil {
			t.Fatal(err)
		}
		pc.Spec.AllowTenantRelease = v
		if err := st.kube.Update(context.Background(), pc); err != nil {
			t.Fatal(err)
		}
	}

	allow(true)
	if got := st.sweep(t); got == nil || got.Released != 1 || !strings.Contains(strings.Join(st.names(), " "), "gone-3h") {
		t.Fatalf("allowed: status.orphans %+v, backend %v; want the tenant's release kept", got, st.names())
	}
	// Under Report: an orphan, reported, and its entry kept while the
	// instance stands, so that allowing again restores it.
	pc := &nsv1alpha1.ClusterProviderConfig{}
	if err := st.kube.Get(context.Background(), types.NamespacedName{Name: "home"}, pc); err != nil {
		t.Fatal(err)
	}
	pc.Spec.Orphans = &spec.OrphanPolicy{Policy: spec.OrphanPolicyReport}
	pc.Spec.AllowTenantRelease = false
	if err := st.kube.Update(context.Background(), pc); err != nil {
		t.Fatal(err)
	}
	got := st.sweep(t)
	if got == nil || got.Released != 0 || !slices.ContainsFunc(got.Instances, func(o spec.OrphanInstance) bool { return strings.Contains(o.Name, "gone-3h") }) {
		t.Errorf("no longer allowed, policy Report: status.orphans %+v; want the tenant's instance reported as an orphan", got)
	}
	if diff := cmp.Diff([]string{"uid-gone-1"}, releasedUIDs(st.released(t))); diff != "" {
		t.Errorf("status.released while the instance stands (-want +got):\n%s", diff)
	}
	allow(true)
	if got := st.sweep(t); got == nil || got.Released != 1 {
		t.Errorf("allowed again: status.orphans %+v; want the tenant's release counted again", got)
	}

	allow(false)
	pc = &nsv1alpha1.ClusterProviderConfig{}
	if err := st.kube.Get(context.Background(), types.NamespacedName{Name: "home"}, pc); err != nil {
		t.Fatal(err)
	}
	pc.Spec.Orphans = &spec.OrphanPolicy{Policy: spec.OrphanPolicyDelete, MinAge: &metav1.Duration{Duration: time.Hour}}
	if err := st.kube.Update(context.Background(), pc); err != nil {
		t.Fatal(err)
	}
	st.sweep(t)
	if left := strings.Join(st.names(), " "); strings.Contains(left, "gone-3h") {
		t.Errorf("no longer allowed, policy Delete: the sweep kept the tenant's released instance (backend holds %s)", left)
	}
}

// Past its bound, a release is not listed but sets unrecordedTime: the
// sweep then deletes no orphan created before it (it may be the one left
// on purpose), reports it and says why; an orphan created later is still
// deleted. unrecordedTime goes once no orphan as old remains.
func TestSweepWithholdsDeletionWhenAReleaseWentUnrecorded(t *testing.T) {
	st := newSetup(t, &spec.OrphanPolicy{Policy: spec.OrphanPolicyDelete, MinAge: &metav1.Duration{Duration: time.Hour}}, bothScopes)
	now := st.sweeper.clock()
	created := now.Add(-3 * time.Hour)
	// Before the orphan was created (more than the clock skew margin): it
	// cannot be the unrecorded release's instance.
	st.release(t, now, created.Add(-time.Hour), "uid-other")
	st.sweep(t)
	if strings.Contains(strings.Join(st.names(), " "), "gone-3h") {
		t.Error("an orphan created after the unrecorded release was not deleted")
	}

	st = newSetup(t, &spec.OrphanPolicy{Policy: spec.OrphanPolicyDelete, MinAge: &metav1.Duration{Duration: time.Hour}}, bothScopes)
	st.release(t, now, created.Add(time.Minute), "uid-other")
	got := st.sweep(t)
	if !strings.Contains(strings.Join(st.names(), " "), "gone-3h") {
		t.Fatal("the sweep deleted an orphan created before a release went unrecorded")
	}
	if diff := cmp.Diff([]string{"gone-3h=uid-gone-1"}, orphanNames(got)); diff != "" {
		t.Errorf("orphans (-want +got):\n%s", diff)
	}
	if !strings.Contains(strings.Join(st.events.reasons(), " "), string(ReasonWithheld)) {
		t.Errorf("events %v, want %s", st.events.reasons(), ReasonWithheld)
	}
	if r := st.released(t); r == nil || r.UnrecordedTime == nil {
		t.Fatalf("status.released = %+v, want unrecordedTime kept while the orphan stands", r)
	}
	st.remove(t, "gone-3h")
	st.sweep(t)
	if r := st.released(t); r == nil || r.UnrecordedTime != nil {
		t.Errorf("status.released = %+v, want unrecordedTime cleared and the recent entry kept", r)
	}
}

// A release recorded between the sweep's read of status.released and its
// pruning is never lost: the pruning holds the version it read.
func TestSweepPruningKeepsAReleaseRecordedMeanwhile(t *testing.T) {
	st := newSetup(t, nil, bothScopes)
	now := st.sweeper.clock()
	st.release(t, now.Add(-2*time.Hour), time.Time{}, "uid-deleted-by-hand")
	inner := st.sweeper.Configs.Backends[0].Connect
	st.sweeper.Configs.Backends[0].Connect = func(ctx context.Context, c *external.Config) (proxy.Driver, error) {
		// A resource's finalizer records its release while the sweep
		// lists the backend.
		r := st.released(t)
		r.Instances = append(r.Instances, spec.ReleasedInstance{UID: "uid-gone-1", ReleasedAt: metav1.NewTime(now)})
		st.setReleased(t, r)
		return inner(ctx, c)
	}
	st.sweep(t)
	if diff := cmp.Diff([]string{"uid-deleted-by-hand", "uid-gone-1"}, releasedUIDs(st.released(t))); diff != "" {
		t.Errorf("status.released (-want +got):\n%s", diff)
	}
}

func (st *setup) setReleased(t *testing.T, r *spec.ReleasedStatus) {
	t.Helper()
	pc := &nsv1alpha1.ClusterProviderConfig{}
	if err := st.kube.Get(context.Background(), types.NamespacedName{Name: "home"}, pc); err != nil {
		t.Fatal(err)
	}
	pc.Status.Released = r
	if err := st.kube.Status().Update(context.Background(), pc); err != nil {
		t.Fatal(err)
	}
}

func releasedUIDs(r *spec.ReleasedStatus) []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, e := range r.Instances {
		out = append(out, e.UID)
	}
	return out
}

// A live resource that records another instance than one carrying its UID
// left that one behind: a tenant who points its proxy's providerConfigRef
// at a config of its own, has the instance made anew there under a
// changed external name, and points it back, makes a second instance on
// the platform's backend each time. The one it left is reported, never
// deleted, even under policy Delete (its resource is live); the one it
// records is not reported, nor is either while it records none. A
// resource of another config, which may reach this backend's instance
// under an ID of its own (a KVM host it names otherwise), leaves behind
// only what is not named as it is.
func TestSweepReportsAnInstanceALiveResourceLeftBehind(t *testing.T) {
	here := &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "home"}
	other := &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "lab"}
	cases := map[string]struct {
		reason string
		ref    *xpv2.ProviderConfigReference
		// recorded is ns-live's status.atProvider.id, by instance name,
		// or as it is when it names no instance of this backend.
		recorded string
		// externalName is ns-live's; none when empty.
		externalName string
		want         []string
	}{
		"RecordsTheFirst": {
			reason:   "The instance made anew, which the resource does not record, is reported.",
			ref:      here,
			recorded: "ns-live",
			want:     []string{"ns-live-again=uid-ns-live"},
		},
		"RecordsTheSecond": {
			reason:   "The instance the resource left behind is reported.",
			ref:      here,
			recorded: "ns-live-again",
			want:     []string{"ns-live=uid-ns-live"},
		},
		"RecordsNone": {
			reason: "A resource that records no instance may be making one: nothing of it is reported.",
			ref:    here,
		},
		"AnotherConfigsIDOfTheSameInstances": {
			reason:       "A resource of another config that records the instance of its name under that config's ID (its host named otherwise) leaves nothing of that name behind.",
			ref:          other,
			recorded:     "hosts/lab-1/domains/ns-live-again",
			externalName: "ns-live-again",
			want:         []string{"ns-live=uid-ns-live"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			st := newSetup(t, &spec.OrphanPolicy{Policy: spec.OrphanPolicyDelete, MinAge: &metav1.Duration{Duration: time.Hour}}, bothScopes)
			ctx := context.Background()
			// The instance made anew, back on this config's backend.
			req := st.backend.Request("ns-live-again", "uid-ns-live")
			req.Mark.InstallationID = installation
			if _, err := st.backend.Create(ctx, req); err != nil {
				t.Fatal(err)
			}
			ids := map[string]string{}
			for _, i := range st.backend.Instances() {
				ids[i.Name] = i.ID
			}
			mr := &nsproxy.KVMProxy{}
			if err := st.kube.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "live"}, mr); err != nil {
				t.Fatal(err)
			}
			mr.Spec.ProviderConfigReference = tc.ref
			if tc.externalName != "" {
				meta.SetExternalName(mr, tc.externalName)
			}
			mr.Status.AtProvider.ID = ids[tc.recorded]
			if _, ok := ids[tc.recorded]; !ok {
				mr.Status.AtProvider.ID = tc.recorded
			}
			if err := st.kube.Update(ctx, mr); err != nil {
				t.Fatal(err)
			}

			got := st.sweep(t)
			// gone-3h, whose resource is gone, is deleted under Delete.
			if diff := cmp.Diff(tc.want, orphanNames(got)); diff != "" {
				t.Errorf("%s\norphans (-want +got):\n%s", tc.reason, diff)
			}
			left := st.names()
			for _, keep := range []string{"ns-live", "ns-live-again", "cl-live"} {
				if !slices.Contains(left, keep) {
					t.Errorf("%s\nthe sweep deleted %s, whose resource is live (backend holds %v)", tc.reason, keep, left)
				}
			}
		})
	}
}
