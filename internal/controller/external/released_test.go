package external

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

const finalizerName = "finalizer.managedresource.crossplane.io"

// TestDeletes: a resource's deletion deletes its instance unless its
// management policies lack Delete or, where it has one, its deletion
// policy is Orphan.
func TestDeletes(t *testing.T) {
	cases := map[string]struct {
		mg   resource.Managed
		want bool
	}{
		"NamespacedDefault":       {mg: proxyResource(), want: true},
		"NamespacedAll":           {mg: proxyResource(withPolicies(xpv2.ManagementActionAll)), want: true},
		"NamespacedObserveOnly":   {mg: proxyResource(observeOnlyPolicy), want: false},
		"NamespacedWithoutDelete": {mg: proxyResource(withPolicies(xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate)), want: false},
		"NamespacedWithDelete":    {mg: proxyResource(withPolicies(xpv2.ManagementActionObserve, xpv2.ManagementActionDelete)), want: true},
		"ClusterDefault":          {mg: clusterResource(), want: true},
		"ClusterOrphan":           {mg: clusterResource(func(cr *clusterproxy.KVMProxy) { cr.SetDeletionPolicy(xpv2.DeletionOrphan) }), want: false},
		"ClusterObserveOnly": {mg: clusterResource(func(cr *clusterproxy.KVMProxy) {
			cr.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve})
		}), want: false},
		"ClusterOrphanWithDeleteToo": {mg: clusterResource(func(cr *clusterproxy.KVMProxy) {
			cr.SetDeletionPolicy(xpv2.DeletionOrphan)
			cr.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionDelete})
		}), want: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := Deletes(tc.mg); got != tc.want {
				t.Errorf("Deletes() = %v, want %v", got, tc.want)
			}
		})
	}
}

func withPolicies(p ...xpv2.ManagementAction) func(*nsproxy.KVMProxy) {
	return func(cr *nsproxy.KVMProxy) { cr.SetManagementPolicies(p) }
}

func withConfig(kind, name string) func(*nsproxy.KVMProxy) {
	return func(cr *nsproxy.KVMProxy) {
		cr.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: kind, Name: name})
	}
}

func clusterResource(mods ...func(*clusterproxy.KVMProxy)) *clusterproxy.KVMProxy {
	cr := &clusterproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Name: "web", UID: testUID}}
	cr.SetProviderConfigReference(&xpv2.Reference{Name: "legacy"})
	for _, m := range mods {
		m(cr)
	}
	return cr
}

func deletingCluster(cr *clusterproxy.KVMProxy) {
	now := metav1.Now()
	cr.SetDeletionTimestamp(&now)
}

// TestRemoveFinalizerRecordsRelease: a resource whose deletion leaves its
// instance (deletionPolicy Orphan, management policies without Delete) has
// its UID recorded in status.released of the config it names, of each of
// the three kinds, before its finalizer goes; one whose deletion deletes
// its instance records nothing, nor a tenant's on a ClusterProviderConfig
// that does not allow it (allowTenantRelease), whose instance goes to that
// config's orphan sweep. Without the config there is nothing to
// record and the finalizer goes; a config changed since it was read fails
// the write with a conflict, returned so that the reconcile retries, and
// the finalizer stays.
func TestRemoveFinalizerRecordsRelease(t *testing.T) {
	ctx := context.Background()
	// The platform's config, letting its tenants release (most cases), or
	// not, the default.
	cpc := func() *namespacedv1alpha1.ClusterProviderConfig {
		pc := &namespacedv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home"}}
		pc.Spec.AllowTenantRelease = true
		return pc
	}
	strict := func() *namespacedv1alpha1.ClusterProviderConfig {
		return &namespacedv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home"}}
	}
	npc := func() *namespacedv1alpha1.ProviderConfig {
		return &namespacedv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "own"}}
	}
	lpc := func() *clusterv1alpha1.ProviderConfig {
		return &clusterv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "legacy"}}
	}
	full := func() *namespacedv1alpha1.ClusterProviderConfig {
		pc := cpc()
		pc.Status.Released = &spec.ReleasedStatus{}
		for i := range spec.MaxReleased {
			pc.Status.Released.Instances = append(pc.Status.Released.Instances, spec.ReleasedInstance{UID: fmt.Sprintf("uid-old-%d", i)})
		}
		return pc
	}
	recorded := func() *namespacedv1alpha1.ClusterProviderConfig {
		pc := cpc()
		pc.Status.Released = &spec.ReleasedStatus{Instances: []spec.ReleasedInstance{{UID: testUID}}}
		return pc
	}
	conflict := interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
		return kerrors.NewConflict(schema.GroupResource{Group: "m.egressproxy.io", Resource: "clusterproviderconfigs"}, obj.GetName(), fmt.Errorf("the object has been modified"))
	}}

	type want struct {
		uids          map[string][]string // config -> UIDs recorded
		unrecorded    bool
		conflict      bool
		finalizerGone bool
	}
	cases := map[string]struct {
		mg          resource.Managed
		configs     []client.Object
		interceptor *interceptor.Funcs
		want        want
	}{
		"ObserveOnlyOnClusterProviderConfig": {
			mg:      proxyResource(deleting, observeOnlyPolicy, withConfig("ClusterProviderConfig", "home")),
			configs: []client.Object{cpc(), npc()},
			want:    want{uids: map[string][]string{"home": {testUID}}, finalizerGone: true},
		},
		// A tenant's instance on the platform's backend goes to its orphan
		// sweep: nothing recorded, and the resource goes all the same.
		"TenantWithoutDeleteOnPlatformConfigRecordsNothing": {
			mg:      proxyResource(deleting, withPolicies(xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate), withConfig("ClusterProviderConfig", "home")),
			configs: []client.Object{strict(), npc()},
			want:    want{finalizerGone: true},
		},
		"TenantOnAFullPlatformConfigSetsNoUnrecordedTime": {
			mg: proxyResource(deleting, observeOnlyPolicy, withConfig("ClusterProviderConfig", "home")),
			configs: []client.Object{func() client.Object {
				pc := full()
				pc.Spec.AllowTenantRelease = false
				return pc
			}()},
			want: want{finalizerGone: true},
		},
		"WithoutDeleteOnNamespacedProviderConfig": {
			mg:      proxyResource(deleting, withPolicies(xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate), withConfig("ProviderConfig", "own")),
			configs: []client.Object{cpc(), npc()},
			want:    want{uids: map[string][]string{"own": {testUID}}, finalizerGone: true},
		},
		"DeletionPolicyOrphanOnLegacyProviderConfig": {
			mg:      clusterResource(deletingCluster, func(cr *clusterproxy.KVMProxy) { cr.SetDeletionPolicy(xpv2.DeletionOrphan) }),
			configs: []client.Object{lpc(), cpc()},
			want:    want{uids: map[string][]string{"legacy": {testUID}}, finalizerGone: true},
		},
		"NamespacedDefaultPoliciesRecordNothing": {
			mg:      proxyResource(deleting, withConfig("ClusterProviderConfig", "home")),
			configs: []client.Object{cpc()},
			want:    want{finalizerGone: true},
		},
		"ClusterDefaultPoliciesRecordNothing": {
			mg:      clusterResource(deletingCluster),
			configs: []client.Object{lpc()},
			want:    want{finalizerGone: true},
		},
		"MissingConfigLetsGo": {
			mg:      proxyResource(deleting, observeOnlyPolicy, withConfig("ProviderConfig", "gone")),
			configs: []client.Object{cpc()},
			want:    want{finalizerGone: true},
		},
		"AlreadyRecordedOnce": {
			mg:      proxyResource(deleting, observeOnlyPolicy, withConfig("ClusterProviderConfig", "home")),
			configs: []client.Object{recorded()},
			want:    want{uids: map[string][]string{"home": {testUID}}, finalizerGone: true},
		},
		"FullRecordSaysUnrecorded": {
			mg:      proxyResource(deleting, observeOnlyPolicy, withConfig("ClusterProviderConfig", "home")),
			configs: []client.Object{full()},
			want:    want{unrecorded: true, finalizerGone: true},
		},
		"ConflictIsReturned": {
			mg:          proxyResource(deleting, observeOnlyPolicy, withConfig("ClusterProviderConfig", "home")),
			configs:     []client.Object{cpc()},
			interceptor: &conflict,
			want:        want{conflict: true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			meta.AddFinalizer(tc.mg, finalizerName)
			b := fake.NewClientBuilder().WithScheme(testenv.Scheme(t)).WithObjects(append(tc.configs, tc.mg)...).WithStatusSubresource(tc.configs...)
			if tc.interceptor != nil {
				b = b.WithInterceptorFuncs(*tc.interceptor)
			}
			kube := b.Build()
			f := childrenFinalizer{Finalizer: resource.NewAPIFinalizer(kube, finalizerName), kube: kube}
			err := f.RemoveFinalizer(ctx, tc.mg)
			if got := kerrors.IsConflict(err); got != tc.want.conflict {
				t.Fatalf("RemoveFinalizer: %v; want a conflict: %v", err, tc.want.conflict)
			}
			if err != nil && !tc.want.conflict {
				t.Fatalf("RemoveFinalizer: %v", err)
			}
			if gone := !meta.FinalizerExists(tc.mg, finalizerName); gone != tc.want.finalizerGone {
				t.Errorf("finalizer gone = %v, want %v", gone, tc.want.finalizerGone)
			}
			got := map[string][]string{}
			unrecorded := false
			for _, c := range tc.configs {
				pc := c.DeepCopyObject().(configStatus) //nolint:forcetypeassert // Every config kind has a status.
				if err := kube.Get(ctx, client.ObjectKeyFromObject(c), pc); err != nil {
					t.Fatal(err)
				}
				r := pc.ConfigStatus().Released
				if r == nil {
					continue
				}
				unrecorded = unrecorded || r.UnrecordedTime != nil
				if len(r.Instances) == spec.MaxReleased {
					if r.Instances[len(r.Instances)-1].UID == testUID {
						t.Errorf("%s: the record holds more than %d entries", c.GetName(), spec.MaxReleased)
					}
					continue
				}
				for _, e := range r.Instances {
					got[c.GetName()] = append(got[c.GetName()], e.UID)
					if e.UID == testUID && name != "AlreadyRecordedOnce" && e.ReleasedAt.IsZero() {
						t.Errorf("%s: releasedAt not set", c.GetName())
					}
				}
			}
			want := tc.want.uids
			if want == nil {
				want = map[string][]string{}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("status.released UIDs by config (-want +got):\n%s", diff)
			}
			if unrecorded != tc.want.unrecorded {
				t.Errorf("unrecordedTime set = %v, want %v", unrecorded, tc.want.unrecorded)
			}
		})
	}
}

// TestRecordReleaseRoundsUp: the time recorded is never before the
// release, in the whole seconds the API keeps.
func TestRecordReleaseRoundsUp(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 700_000_000, time.UTC)
	pc := &namespacedv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home"}}
	pc.Spec.AllowTenantRelease = true
	kube := fake.NewClientBuilder().WithScheme(testenv.Scheme(t)).WithObjects(pc).WithStatusSubresource(pc).Build()
	mg := proxyResource(deleting, observeOnlyPolicy, withConfig("ClusterProviderConfig", "home"))
	if err := recordRelease(context.Background(), kube, mg, now); err != nil {
		t.Fatal(err)
	}
	if err := kube.Get(context.Background(), client.ObjectKeyFromObject(pc), pc); err != nil {
		t.Fatal(err)
	}
	if r := pc.Status.Released; r == nil || len(r.Instances) != 1 || r.Instances[0].ReleasedAt.Time.Before(now) {
		t.Errorf("status.released = %+v, want one entry at or after %s", r, now)
	} else if r.Instances[0].Namespace != mg.GetNamespace() {
		t.Errorf("a tenant's release on the platform's config records namespace %q, want %q", r.Instances[0].Namespace, mg.GetNamespace())
	}
}
