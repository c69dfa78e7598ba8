package external

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
)

// watchConfigs queues the resources of the controller's kind that failed
// their last reconcile (Synced=False) and name a config that may have
// been fixed: created, its spec changed, or its Healthy condition turned
// True (a Secret fixed, a backend back, as the config's periodic check
// finds). Without it they wait out the runtime's backoff (up to a minute,
// or the quota retry interval). Resources that work are left to their
// poll, and a config's other status writes queue nothing. Raw sources,
// past the controller's event filter, as the kinds' own watches.
func watchConfigs(mgr ctrl.Manager, b *builder.Builder, mr client.Object, list func() client.ObjectList) *builder.Builder {
	kube := mgr.GetClient()
	switch mr.(type) {
	case resource.ModernManaged:
		return b.
			WatchesRawSource(source.Kind(mgr.GetCache(), &namespacedv1alpha1.ProviderConfig{},
				handler.TypedEnqueueRequestsFromMapFunc(failingUsers[*namespacedv1alpha1.ProviderConfig](kube, list, namespacedv1alpha1.ProviderConfigKind)),
				configFixed[*namespacedv1alpha1.ProviderConfig]())).
			WatchesRawSource(source.Kind(mgr.GetCache(), &namespacedv1alpha1.ClusterProviderConfig{},
				handler.TypedEnqueueRequestsFromMapFunc(failingUsers[*namespacedv1alpha1.ClusterProviderConfig](kube, list, namespacedv1alpha1.ClusterProviderConfigKind)),
				configFixed[*namespacedv1alpha1.ClusterProviderConfig]()))
	case resource.LegacyManaged:
		return b.WatchesRawSource(source.Kind(mgr.GetCache(), &clusterv1alpha1.ProviderConfig{},
			handler.TypedEnqueueRequestsFromMapFunc(failingUsers[*clusterv1alpha1.ProviderConfig](kube, list, clusterv1alpha1.ProviderConfigKind)),
			configFixed[*clusterv1alpha1.ProviderConfig]()))
	}
	return b
}

// TypeConfigHealthy is the config condition of package health (which
// imports this one) that says every check of its backend passed.
const TypeConfigHealthy xpv2.ConditionType = "Healthy"

// conditioned is a config as configFixed reads it.
type conditioned interface {
	client.Object
	GetCondition(xpv2.ConditionType) xpv2.Condition
}

// configFixed passes a config's creation, a change of its spec, and its
// Healthy condition turning True.
func configFixed[T conditioned]() predicate.TypedPredicate[T] {
	return predicate.TypedFuncs[T]{
		CreateFunc: func(ctrlevent.TypedCreateEvent[T]) bool { return true },
		UpdateFunc: func(e ctrlevent.TypedUpdateEvent[T]) bool {
			if e.ObjectNew.GetGeneration() != e.ObjectOld.GetGeneration() {
				return true
			}
			return e.ObjectNew.GetCondition(TypeConfigHealthy).Status == corev1.ConditionTrue &&
				e.ObjectOld.GetCondition(TypeConfigHealthy).Status != corev1.ConditionTrue
		},
		DeleteFunc:  func(ctrlevent.TypedDeleteEvent[T]) bool { return false },
		GenericFunc: func(ctrlevent.TypedGenericEvent[T]) bool { return false },
	}
}

// failingUsers maps a config of kind to the resources in list's kind
// (cached) that name it and are Synced=False. A namespaced config is named
// only by resources of its namespace.
func failingUsers[T client.Object](kube client.Reader, list func() client.ObjectList, kind string) handler.TypedMapFunc[T, reconcile.Request] {
	return func(ctx context.Context, pc T) []reconcile.Request {
		l := list()
		var opts []client.ListOption
		if pc.GetNamespace() != "" {
			opts = append(opts, client.InNamespace(pc.GetNamespace()))
		}
		if err := kube.List(ctx, l, opts...); err != nil {
			return nil
		}
		var out []reconcile.Request
		_ = apimeta.EachListItem(l, func(o runtime.Object) error {
			mg, ok := o.(resource.Managed)
			if !ok || !names(mg, kind, pc.GetName()) || mg.GetCondition(xpv2.TypeSynced).Status != corev1.ConditionFalse {
				return nil
			}
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: mg.GetNamespace(), Name: mg.GetName()}})
			return nil
		})
		return out
	}
}

// names reports whether mg's providerConfigRef names the config kind/name
// (a legacy resource's reference has no kind: it names its scope's one).
func names(mg resource.Managed, kind, name string) bool {
	switch r := mg.(type) {
	case resource.TypedProviderConfigReferencer:
		ref := r.GetProviderConfigReference()
		return ref != nil && ref.Kind == kind && ref.Name == name
	case resource.ProviderConfigReferencer:
		ref := r.GetProviderConfigReference()
		return ref != nil && ref.Name == name
	}
	return false
}
