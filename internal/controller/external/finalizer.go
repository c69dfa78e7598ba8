package external

import (
	"context"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
)

// childrenFinalizer is the managed reconciler's finalizer with one step
// before the finalizer goes, once the resource is being deleted and its
// instance is gone (or orphaned): the resource's connection Secret and
// ProviderConfigUsage, both controlled by it, are deleted here, one DELETE
// each, instead of by the garbage collector after the resource has gone
// (which reads each owner before it deletes: a GET and a DELETE). The outcome
// is the same: neither outlives the resource. Only an object whose
// controller is this resource is deleted, with its UID as precondition (a
// Secret of the same name made since is never touched); anything else, and
// any failure, is left to the garbage collector as before.
type childrenFinalizer struct {
	resource.Finalizer
	kube client.Client
	// release is the kind's Release hook, or nil.
	release func(ctx context.Context, kube client.Client, mg resource.Managed) error
}

// RemoveFinalizer implements resource.Finalizer. First of all, the kind's
// Release hook (Kind.Release), if any, undoes what would make the garbage
// collector delete an instance the resource's deletion leaves; then, for
// such a resource, the config it uses records the release
// (status.released), so that the orphan sweep leaves the instance alone
// (a tenant's on a ClusterProviderConfig only where allowTenantRelease:
// recordRelease).
// An error of either keeps the finalizer, and the reconcile is retried.
func (f childrenFinalizer) RemoveFinalizer(ctx context.Context, obj resource.Object) error {
	if mg, ok := obj.(resource.Managed); ok && meta.WasDeleted(mg) {
		if f.release != nil {
			if err := f.release(ctx, f.kube, mg); err != nil {
				return err
			}
		}
		if !Deletes(mg) {
			if err := recordRelease(ctx, f.kube, mg, time.Now()); err != nil {
				return err
			}
		}
		// At once, not one after the other: the resource goes only after
		// them, and each is a round trip to the API server.
		var wg sync.WaitGroup
		for _, child := range controlledChildren(mg) {
			wg.Go(func() { f.deleteIfControlled(ctx, mg, child) })
		}
		wg.Wait()
	}
	return f.Finalizer.RemoveFinalizer(ctx, obj)
}

// controlledChildren are the objects a managed resource's controller makes
// for it, named but not read: its connection Secret, when it asks for one,
// and the usage crossplane-runtime's tracker names after its UID.
func controlledChildren(mg resource.Managed) []client.Object {
	var out []client.Object
	switch o := mg.(type) {
	case resource.LocalConnectionSecretOwner:
		if ref := o.GetWriteConnectionSecretToReference(); ref != nil {
			out = append(out, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mg.GetNamespace(), Name: ref.Name}})
		}
	case resource.ConnectionSecretOwner:
		if ref := o.GetWriteConnectionSecretToReference(); ref != nil {
			out = append(out, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}})
		}
	}
	name := string(mg.GetUID())
	if name == "" {
		return out
	}
	if mg.GetNamespace() != "" {
		out = append(out, &namespacedv1alpha1.ProviderConfigUsage{ObjectMeta: metav1.ObjectMeta{Namespace: mg.GetNamespace(), Name: name}})
	} else {
		out = append(out, &clusterv1alpha1.ProviderConfigUsage{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	return out
}

// deleteIfControlled deletes obj (read from the cache) when mg is its
// controller. Best effort: the garbage collector deletes what is left.
func (f childrenFinalizer) deleteIfControlled(ctx context.Context, mg resource.Managed, obj client.Object) {
	if err := f.kube.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return
	}
	if !metav1.IsControlledBy(obj, mg) {
		return
	}
	uid := obj.GetUID()
	if err := f.kube.Delete(ctx, obj, client.Preconditions{UID: &uid}); err != nil && !kerrors.IsNotFound(err) {
		return
	}
}
