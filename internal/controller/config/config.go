// Package config sets up the ProviderConfig controllers: usage accounting
// (a config in use is not deleted) for all three config kinds, and the
// protection of a namespaced config and its Secrets while managed
// resources name it (Protector).
package config

import (
	"context"
	"slices"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/providerconfig"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
)

// Setup registers usage accounting for every config kind, and the
// Protector of namespaced ProviderConfigs, which counts the managed
// resources of kinds (the namespaced ones). rm is the manager the usage
// reconcilers take their client from (a config whose finalizer is in place
// needs no update each time a usage comes or goes).
func Setup(mgr, rm ctrl.Manager, o controller.Options, kinds []schema.GroupVersionKind) error {
	for _, c := range []struct {
		config, usage client.Object
		kinds         resource.ProviderConfigKinds
		kind          string
	}{
		{&nsv1alpha1.ProviderConfig{}, &nsv1alpha1.ProviderConfigUsage{}, resource.ProviderConfigKinds{
			Config: nsv1alpha1.ProviderConfigGroupVersionKind, Usage: nsv1alpha1.ProviderConfigUsageGroupVersionKind,
			UsageList: nsv1alpha1.SchemeGroupVersion.WithKind(nsv1alpha1.ProviderConfigUsageListKind),
		}, nsv1alpha1.ProviderConfigKind},
		{&nsv1alpha1.ClusterProviderConfig{}, &nsv1alpha1.ProviderConfigUsage{}, resource.ProviderConfigKinds{
			Config: nsv1alpha1.ClusterProviderConfigGroupVersionKind, Usage: nsv1alpha1.ProviderConfigUsageGroupVersionKind,
			UsageList: nsv1alpha1.SchemeGroupVersion.WithKind(nsv1alpha1.ProviderConfigUsageListKind),
		}, nsv1alpha1.ClusterProviderConfigKind},
		{&clusterv1alpha1.ProviderConfig{}, &clusterv1alpha1.ProviderConfigUsage{}, resource.ProviderConfigKinds{
			Config: clusterv1alpha1.ProviderConfigGroupVersionKind, Usage: clusterv1alpha1.ProviderConfigUsageGroupVersionKind,
			UsageList: clusterv1alpha1.SchemeGroupVersion.WithKind(clusterv1alpha1.ProviderConfigUsageListKind),
		}, ""},
	} {
		name := providerconfig.ControllerName(c.kinds.Config.GroupKind().String())
		r := providerconfig.NewReconciler(rm, c.kinds,
			providerconfig.WithLogger(o.Logger.WithValues("controller", name)),
			providerconfig.WithRecorder(event.NewAPIRecorder(mgr.GetEventRecorderFor(name))))
		if err := ctrl.NewControllerManagedBy(mgr).
			Named(name).
			WithOptions(o.ForControllerRuntime()).
			For(c.config, builder.WithPredicates(accountingChanged())).
			Watches(c.usage, batchedUsages{inner: &resource.EnqueueRequestForProviderConfig{Kind: c.kind}, after: countBatch}).
			Complete(ratelimiter.NewReconciler(name, r, o.GlobalRateLimiter)); err != nil {
			return err
		}
	}
	name := "protection/" + nsv1alpha1.ProviderConfigGroupVersionKind.GroupKind().String()
	p := &Protector{Kube: mgr.GetClient(), Secrets: mgr.GetAPIReader(), Kinds: kinds}
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(&nsv1alpha1.ProviderConfig{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, protectionChanged()))).
		Watches(&nsv1alpha1.ProviderConfigUsage{}, batchedUsages{inner: &resource.EnqueueRequestForProviderConfig{Kind: nsv1alpha1.ProviderConfigKind}, after: usageBatch}).
		Complete(ratelimiter.NewReconciler(name, p, o.GlobalRateLimiter))
}

// accountingChanged passes the updates of a config that change what the
// usage reconciler does with it: its spec, the start of its deletion and
// its finalizers. Status writes (the count it writes itself, the health
// check's targets) pass no: while usages arrive, each count written would
// otherwise trigger the next recount and write at once, ahead of the
// batch of usage events (countBatch).
func accountingChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
		if e.ObjectOld == nil || e.ObjectNew == nil {
			return true
		}
		return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() ||
			meta.WasDeleted(e.ObjectNew) != meta.WasDeleted(e.ObjectOld) ||
			!slices.Equal(e.ObjectOld.GetFinalizers(), e.ObjectNew.GetFinalizers())
	}}
}

// protectionChanged passes updates that start a config's deletion or take
// its InUseFinalizer away (status writes, the usage count, pass no).
func protectionChanged() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
		return meta.WasDeleted(e.ObjectNew) != meta.WasDeleted(e.ObjectOld) ||
			meta.FinalizerExists(e.ObjectOld, InUseFinalizer) != meta.FinalizerExists(e.ObjectNew, InUseFinalizer)
	}}
}

// countBatch is how long a config's usage count (status.users) waits for
// more usages to come or go: a thousand proxies created at once update
// the count a few times instead of a thousand (a write each), and the
// count is no more than that late. Deletion is still refused while any
// usage exists: the reconciler lists them on every reconcile.
const countBatch = 5 * time.Second

// usageBatch is the same for the protection of a namespaced config and
// its Secrets (Protector), which goes a second after its last usage.
const usageBatch = time.Second

// batchedUsages is crossplane-runtime's handler for usage events, with
// every request delayed by after (requests for one config within that
// window become one).
type batchedUsages struct {
	inner *resource.EnqueueRequestForProviderConfig
	after time.Duration
}

func (b batchedUsages) Create(ctx context.Context, e ctrlevent.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	b.inner.Create(ctx, e, delayedAdds{q, b.after})
}

func (b batchedUsages) Update(ctx context.Context, e ctrlevent.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	b.inner.Update(ctx, e, delayedAdds{q, b.after})
}

func (b batchedUsages) Delete(ctx context.Context, e ctrlevent.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	b.inner.Delete(ctx, e, delayedAdds{q, b.after})
}

func (b batchedUsages) Generic(ctx context.Context, e ctrlevent.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	b.inner.Generic(ctx, e, delayedAdds{q, b.after})
}

// delayedAdds turns Add into AddAfter.
type delayedAdds struct {
	workqueue.TypedRateLimitingInterface[reconcile.Request]
	after time.Duration
}

func (d delayedAdds) Add(r reconcile.Request) { d.AddAfter(r, d.after) }
