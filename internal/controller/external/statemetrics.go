package external

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	"github.com/crossplane/crossplane-runtime/v2/pkg/statemetrics"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// stateRecorder sets crossplane-runtime's managed resource state metrics
// (crossplane_managed_resource_exists, _ready and _synced) of one kind
// every interval, as the runtime's MRStateRecorder does, from the objects
// of the manager's cache themselves. The runtime's recorder lists into
// one list it keeps: a shallow copy of every resource, held between
// recordings and made anew every interval, so memory and garbage grow
// with the number of resources for nothing the cache does not hold.
type stateRecorder struct {
	informers cache.Informers
	obj       client.Object // of the kind, for its informer
	labels    prometheus.Labels
	metrics   *statemetrics.MRStateMetrics
	interval  time.Duration
}

// newStateRecorder records the state of kind gvk, whose objects are like
// obj, from informers.
func newStateRecorder(informers cache.Informers, obj client.Object, gvk schema.GroupVersionKind, m *statemetrics.MRStateMetrics, interval time.Duration) *stateRecorder {
	// The runtime's recorder labels by the list's kind without "List".
	return &stateRecorder{informers: informers, obj: obj, labels: prometheus.Labels{"gvk": gvk.String()}, metrics: m, interval: interval}
}

// Record sets the metrics once.
func (r *stateRecorder) Record(ctx context.Context) error {
	i, err := r.informers.GetInformer(ctx, r.obj)
	if err != nil {
		return errors.Wrap(err, "failed to list managed resources")
	}
	s, ok := i.(interface{ GetStore() toolscache.Store })
	if !ok {
		return errors.Errorf("failed to list managed resources: the informer of %T has no store", r.obj)
	}
	items := s.GetStore().List()
	var ready, synced float64
	for _, o := range items {
		mg, ok := o.(resource.Managed)
		if !ok {
			continue
		}
		if mg.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
			ready++
		}
		if mg.GetCondition(xpv2.TypeSynced).Status == corev1.ConditionTrue {
			synced++
		}
	}
	r.metrics.Exists.With(r.labels).Set(float64(len(items)))
	r.metrics.Ready.With(r.labels).Set(ready)
	r.metrics.Synced.With(r.labels).Set(synced)
	return nil
}

// Start records every interval until ctx ends; like the runtime's
// recorder, a failure stops it (and the manager).
func (r *stateRecorder) Start(ctx context.Context) error {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := r.Record(ctx); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}
