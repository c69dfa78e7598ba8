package external

import (
	"context"
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// TestConfigFixedPasses: a config's creation, a spec change and Healthy
// turning True queue its failing resources; a status write that leaves
// Healthy as it was (the usage count, a check that still fails, one that
// still passes) and a deletion do not.
func TestConfigFixedPasses(t *testing.T) {
	pc := func(gen int64, healthy corev1.ConditionStatus) *namespacedv1alpha1.ClusterProviderConfig {
		c := &namespacedv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "default", Generation: gen}}
		if healthy != "" {
			c.SetConditions(xpv2.Condition{Type: TypeConfigHealthy, Status: healthy})
		}
		return c
	}
	p := configFixed[*namespacedv1alpha1.ClusterProviderConfig]()
	if !p.Create(ctrlevent.TypedCreateEvent[*namespacedv1alpha1.ClusterProviderConfig]{Object: pc(1, "")}) {
		t.Error("a config's creation does not pass")
	}
	if p.Delete(ctrlevent.TypedDeleteEvent[*namespacedv1alpha1.ClusterProviderConfig]{Object: pc(1, "")}) {
		t.Error("a config's deletion passes")
	}
	cases := map[string]struct {
		old, new *namespacedv1alpha1.ClusterProviderConfig
		want     bool
	}{
		"SpecChanged":       {pc(1, corev1.ConditionFalse), pc(2, corev1.ConditionFalse), true},
		"TurnedHealthy":     {pc(1, corev1.ConditionFalse), pc(1, corev1.ConditionTrue), true},
		"FirstCheckHealthy": {pc(1, ""), pc(1, corev1.ConditionTrue), true},
		"StillUnhealthy":    {pc(1, corev1.ConditionFalse), pc(1, corev1.ConditionFalse), false},
		"StillHealthy":      {pc(1, corev1.ConditionTrue), pc(1, corev1.ConditionTrue), false},
		"TurnedUnhealthy":   {pc(1, corev1.ConditionTrue), pc(1, corev1.ConditionFalse), false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := p.Update(ctrlevent.TypedUpdateEvent[*namespacedv1alpha1.ClusterProviderConfig]{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
				t.Errorf("Update passes: %v, want %v", got, tc.want)
			}
		})
	}
}

// TestFailingUsers: a config queues the resources that name it, of its
// kind (a namespaced ProviderConfig only in its namespace), whose last
// reconcile failed; not those that work, nor those naming another config.
func TestFailingUsers(t *testing.T) {
	kvm := func(ns, name, kind, config string, synced corev1.ConditionStatus) *nsproxy.KVMProxy {
		p := &nsproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		p.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: kind, Name: config})
		p.SetConditions(xpv2.Condition{Type: xpv2.TypeSynced, Status: synced})
		return p
	}
	legacy := func(name, config string, synced corev1.ConditionStatus) *clusterproxy.KVMProxy {
		p := &clusterproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Name: name}}
		p.SetProviderConfigReference(&xpv2.Reference{Name: config})
		p.SetConditions(xpv2.Condition{Type: xpv2.TypeSynced, Status: synced})
		return p
	}
	kube := fake.NewClientBuilder().WithScheme(testenv.Scheme(t)).WithObjects(
		kvm("team-a", "broken", "ProviderConfig", "lab", corev1.ConditionFalse),
		kvm("team-a", "working", "ProviderConfig", "lab", corev1.ConditionTrue),
		kvm("team-a", "other-config", "ProviderConfig", "nas", corev1.ConditionFalse),
		kvm("team-b", "same-name-elsewhere", "ProviderConfig", "lab", corev1.ConditionFalse),
		kvm("team-b", "cluster-config", "ClusterProviderConfig", "lab", corev1.ConditionFalse),
		legacy("legacy-broken", "lab", corev1.ConditionFalse),
		legacy("legacy-working", "lab", corev1.ConditionTrue),
	).Build()
	nsList := func() client.ObjectList { return &nsproxy.KVMProxyList{} }
	clusterList := func() client.ObjectList { return &clusterproxy.KVMProxyList{} }
	ctx := context.Background()
	req := func(ns, name string) reconcile.Request {
		return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}
	}

	got := failingUsers[*namespacedv1alpha1.ProviderConfig](kube, nsList, namespacedv1alpha1.ProviderConfigKind)(ctx,
		&namespacedv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "lab"}})
	if diff := cmp.Diff([]reconcile.Request{req("team-a", "broken")}, got); diff != "" {
		t.Errorf("ProviderConfig team-a/lab queues: -want, +got:\n%s", diff)
	}
	got = failingUsers[*namespacedv1alpha1.ClusterProviderConfig](kube, nsList, namespacedv1alpha1.ClusterProviderConfigKind)(ctx,
		&namespacedv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "lab"}})
	if diff := cmp.Diff([]reconcile.Request{req("team-b", "cluster-config")}, got); diff != "" {
		t.Errorf("ClusterProviderConfig lab queues: -want, +got:\n%s", diff)
	}
	got = failingUsers[*clusterv1alpha1.ProviderConfig](kube, clusterList, clusterv1alpha1.ProviderConfigKind)(ctx,
		&clusterv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "lab"}})
	if diff := cmp.Diff([]reconcile.Request{req("", "legacy-broken")}, got); diff != "" {
		t.Errorf("legacy ProviderConfig lab queues: -want, +got:\n%s", diff)
	}
}
