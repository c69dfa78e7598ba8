// Package crdgate opens crossplane-runtime's safe-start gate for the kinds
// whose CRDs are established, as crossplane-runtime's customresourcesgate
// does, with one difference: a CRD being deleted stays open. Deleting a
// CRD deletes its objects, and each waits for its finalizer, which only a
// running controller removes (after deleting the proxy's instance). A
// provider that starts while its CRDs are being deleted (Crossplane
// installs it again when a Configuration depends on it, or the user does)
// must run those controllers, or the objects and their CRDs stay stuck
// and the instances run on (docs/install.md, Deleting the Provider while
// proxies exist).
package crdgate

import (
	"context"
	"errors"
	"reflect"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Reconciler reports each CRD's served kinds to the gate.
type Reconciler struct {
	Log  logging.Logger
	Gate controller.Gate
}

// Reconcile opens the gate for the served versions of an established CRD,
// being deleted or not, and closes it for a CRD not (or no longer)
// established.
func (r *Reconciler) Reconcile(_ context.Context, crd *apiextensionsv1.CustomResourceDefinition) (ctrl.Result, error) {
	est := established(crd)
	for _, v := range crd.Spec.Versions {
		gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind}
		switch {
		case !est:
			r.Gate.Set(gvk, false)
		case v.Served:
			if !crd.GetDeletionTimestamp().IsZero() {
				r.Log.Debug("CRD is being deleted: its controller runs to finish its objects' deletions", "gvk", gvk)
			}
			r.Gate.Set(gvk, true)
		}
	}
	return ctrl.Result{}, nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

// Setup adds the gate's controller; o.Gate must be set.
func Setup(mgr ctrl.Manager, o controller.Options) error {
	if o.Gate == nil || reflect.ValueOf(o.Gate).IsNil() {
		return errors.New("the safe-start gate is required")
	}
	r := &Reconciler{Log: o.Logger, Gate: o.Gate}
	return ctrl.NewControllerManagedBy(mgr).
		For(&apiextensionsv1.CustomResourceDefinition{}).
		Named("crd-gate").
		Complete(reconcile.AsReconciler[*apiextensionsv1.CustomResourceDefinition](mgr.GetClient(), r))
}
