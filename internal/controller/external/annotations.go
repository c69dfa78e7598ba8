package external

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"sigs.k8s.io/controller-runtime/pkg/client"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// annotationUpdater is crossplane-runtime's retrying critical-annotation
// updater, except that the observation Create recorded survives it. The
// update's response carries the server's status, which would replace what
// Create observed; kept, it is saved by the status write that follows
// Create, in the same request as the conditions.
type annotationUpdater struct {
	inner managed.CriticalAnnotationUpdater
}

func (u annotationUpdater) UpdateCriticalAnnotations(ctx context.Context, o client.Object) error {
	r, ok := o.(interface{ Observation() *spec.ProxyObservation })
	if !ok {
		return u.inner.UpdateCriticalAnnotations(ctx, o)
	}
	keep := r.Observation().DeepCopy()
	err := u.inner.UpdateCriticalAnnotations(ctx, o)
	*r.Observation() = *keep
	return err
}
