package kubernetes

import (
	"context"
	"fmt"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Delete implements proxy.Driver: it deletes the Deployment in the
// foreground, so the garbage collector removes the pods, the Secret and
// the Service before the Deployment itself goes. It returns at once.
func (d *Driver) Delete(ctx context.Context, ref proxy.Ref) error {
	return proxy.RunErr(ctx, proxy.OpDelete, d.wrap, func(ctx context.Context) error { return d.delete(ctx, ref) })
}

func (d *Driver) delete(ctx context.Context, ref proxy.Ref) error {
	dep, err := d.deployment(ctx, ref)
	switch {
	case proxy.IsNotFound(err):
		return nil
	case err != nil:
		return err
	case dep.DeletionTimestamp != nil:
		return nil // on its way
	}
	if err := owned(dep, ref.Mark, "delete"); err != nil {
		return err
	}
	err = d.client.Delete(ctx, dep,
		client.PropagationPolicy(metav1.DeletePropagationForeground),
		// Never delete a Deployment of the same name made since the read.
		client.Preconditions{UID: &dep.UID})
	if err != nil && !kerrors.IsNotFound(err) {
		if kerrors.IsConflict(err) {
			return proxy.Transientf("Deployment %s/%s changed while being deleted; will retry", dep.Namespace, dep.Name)
		}
		return fmt.Errorf("cannot delete Deployment %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	d.logger(ctx).V(1).Info("deleted Deployment", "namespace", dep.Namespace, "name", dep.Name)
	return nil
}
