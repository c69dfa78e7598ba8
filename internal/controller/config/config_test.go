package config

import (
	"context"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
)

// queue records what is added to it, and when.
type queue struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	added []string
}

func (q *queue) Add(r reconcile.Request) { q.added = append(q.added, r.String()+" now") }

func (q *queue) AddAfter(r reconcile.Request, d time.Duration) {
	q.added = append(q.added, r.String()+" after "+d.String())
}

func nsUsage(kind, name string) client.Object {
	u := &nsv1alpha1.ProviderConfigUsage{}
	u.Namespace, u.Name = "team-a", "u-1"
	u.SetProviderConfigReference(xpv2.ProviderConfigReference{Kind: kind, Name: name})
	return u
}

func legacyUsage(name string) client.Object {
	u := &clusterv1alpha1.ProviderConfigUsage{}
	u.Name = "u-1"
	u.SetProviderConfigReference(xpv2.Reference{Name: name})
	return u
}

// TestBatchedUsages: every usage event enqueues its config after
// countBatch, never at once, so that many usages coming or going at once
// make a few usage-count writes; a usage of another config kind enqueues
// nothing for this one.
func TestBatchedUsages(t *testing.T) {
	cases := map[string]struct {
		kind  string
		usage client.Object
		event func(h batchedUsages, o client.Object, q *queue)
		want  []string
	}{
		"NamespacedConfigCreate": {
			kind: nsv1alpha1.ProviderConfigKind, usage: nsUsage("ProviderConfig", "home"),
			event: func(h batchedUsages, o client.Object, q *queue) {
				h.Create(context.Background(), ctrlevent.CreateEvent{Object: o}, q)
			},
			want: []string{"team-a/home after 5s"},
		},
		"ClusterConfigDelete": {
			kind: nsv1alpha1.ClusterProviderConfigKind, usage: nsUsage("ClusterProviderConfig", "shared"),
			event: func(h batchedUsages, o client.Object, q *queue) {
				h.Delete(context.Background(), ctrlevent.DeleteEvent{Object: o}, q)
			},
			want: []string{"/shared after 5s"},
		},
		"OtherKindIgnored": {
			kind: nsv1alpha1.ProviderConfigKind, usage: nsUsage("ClusterProviderConfig", "shared"),
			event: func(h batchedUsages, o client.Object, q *queue) {
				h.Update(context.Background(), ctrlevent.UpdateEvent{ObjectOld: o, ObjectNew: o}, q)
			},
		},
		"LegacyGeneric": {
			usage: legacyUsage("home"),
			event: func(h batchedUsages, o client.Object, q *queue) {
				h.Generic(context.Background(), ctrlevent.GenericEvent{Object: o}, q)
			},
			want: []string{"/home after 5s"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			q := &queue{}
			tc.event(batchedUsages{inner: &resource.EnqueueRequestForProviderConfig{Kind: tc.kind}, after: countBatch}, tc.usage, q)
			if diff := cmp.Diff(tc.want, q.added, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("queued: -want, +got:\n%s", diff)
			}
		})
	}
}

// TestAccountingChanged: the usage reconciler of a config is triggered by
// what changes its work (spec, deletion, finalizers), not by status
// writes, its own usage count among them.
func TestAccountingChanged(t *testing.T) {
	base := func() *nsv1alpha1.ClusterProviderConfig {
		pc := &nsv1alpha1.ClusterProviderConfig{}
		pc.Name, pc.Generation, pc.ResourceVersion = "default", 1, "10"
		pc.Finalizers = []string{"in-use.crossplane.io"}
		return pc
	}
	cases := map[string]struct {
		change func(pc *nsv1alpha1.ClusterProviderConfig)
		want   bool
	}{
		"UsageCountWritten": {func(pc *nsv1alpha1.ClusterProviderConfig) { pc.Status.Users = 7; pc.ResourceVersion = "11" }, false},
		"Resync":            {func(*nsv1alpha1.ClusterProviderConfig) {}, false},
		"SpecChanged":       {func(pc *nsv1alpha1.ClusterProviderConfig) { pc.Generation = 2 }, true},
		"DeletionStarted": {func(pc *nsv1alpha1.ClusterProviderConfig) {
			now := metav1.Now()
			pc.DeletionTimestamp = &now
		}, true},
		"FinalizerRemoved": {func(pc *nsv1alpha1.ClusterProviderConfig) { pc.Finalizers = nil }, true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			old, upd := base(), base()
			tc.change(upd)
			if got := accountingChanged().Update(ctrlevent.UpdateEvent{ObjectOld: old, ObjectNew: upd}); got != tc.want {
				t.Errorf("Update passes: got %v, want %v", got, tc.want)
			}
		})
	}
	if !accountingChanged().Create(ctrlevent.CreateEvent{Object: base()}) || !accountingChanged().Delete(ctrlevent.DeleteEvent{Object: base()}) {
		t.Error("a config's create and delete must pass")
	}
}
