package external

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// ownConditions are the conditions the external client sets itself (the
// reconciler sets Ready and Synced after the annotation update anyway).
var ownConditions = []xpv2.ConditionType{spec.TypeSecure, spec.TypeEgressVerified}

// keepingCreated runs write, a write of o whose response replaces o's
// status with the server's, and keeps what Create recorded in the status:
// the observation and the conditions of ownConditions. The status write
// that follows Create then saves them in one request, instead of the
// first Observe's (a status write more, and a Warning event recorded
// twice).
func keepingCreated(o client.Object, write func() error) error {
	var keep []xpv2.Condition
	if c, ok := o.(resource.Conditioned); ok {
		for _, t := range ownConditions {
			if k := c.GetCondition(t); k.Reason != "" {
				keep = append(keep, k)
			}
		}
	}
	r, ok := o.(interface{ Observation() *spec.ProxyObservation })
	var obs *spec.ProxyObservation
	if ok {
		obs = r.Observation().DeepCopy()
	}
	err := write()
	if ok {
		*r.Observation() = *obs
	}
	if c, ok := o.(resource.Conditioned); ok && len(keep) > 0 {
		c.SetConditions(keep...)
	}
	return err
}

// annotationUpdater is crossplane-runtime's retrying critical-annotation
// updater, except that what Create recorded in the status survives it
// (keepingCreated).
type annotationUpdater struct {
	inner managed.CriticalAnnotationUpdater
}

func (u annotationUpdater) UpdateCriticalAnnotations(ctx context.Context, o client.Object) error {
	return keepingCreated(o, func() error { return u.inner.UpdateCriticalAnnotations(ctx, o) })
}
