package config

import (
	"context"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The health checks and the orphan sweep are each a periodic controller
// of the config kinds: one controller per kind, reconciling a config when
// it is created, when its spec changes and then every interval (the
// reconciler requeues itself).

// NewFunc returns a function making an empty object of the config kind
// gvk, as T (an interface every config kind implements).
func NewFunc[T client.Object](mgr ctrl.Manager, gvk schema.GroupVersionKind) func() T {
	return func() T {
		o, _ := mgr.GetScheme().New(gvk)
		return o.(T) //nolint:forcetypeassert // Only config kinds are passed.
	}
}

// SetupPeriodic registers r as the controller name of the kind of obj,
// with up to workers configs reconciled at once. Only a new config and a
// change of its spec trigger r: status writes (r's own, the usage
// controller's) do not.
func SetupPeriodic(mgr ctrl.Manager, name string, obj client.Object, workers int, r reconcile.Reconciler) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		For(obj, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// GetLive reads the config nn into pc. It returns false, with the error
// of a failed read other than NotFound, when there is nothing to check: a
// config that is gone or being deleted, for which forget is called first
// (what a periodic controller reports of it, such as a metric, must go
// with it).
func GetLive(ctx context.Context, kube client.Client, nn types.NamespacedName, pc client.Object, forget func()) (bool, error) {
	if err := kube.Get(ctx, nn, pc); err != nil {
		if kerrors.IsNotFound(err) {
			forget()
		}
		return false, client.IgnoreNotFound(err)
	}
	if pc.GetDeletionTimestamp() != nil {
		forget()
		return false, nil
	}
	return true, nil
}
