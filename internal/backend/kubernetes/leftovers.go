package kubernetes

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// leftovers are the children of the proxy key names, carrying mark, that
// stand without their Deployment: a Deployment deleted with its children
// orphaned (kubectl delete --cascade=orphan), or children an earlier
// version wrote before the Deployment. Nothing owns them, so the garbage
// collector never removes them; the resource being deleted waits for them
// and Delete removes them. Objects of the name that are not this proxy's
// are never listed.
//
// It is read only when the watch did not see the proxy's Deployment go:
// children of a Deployment it saw deleted are the garbage collector's.
func (d *Driver) leftovers(ctx context.Context, key types.NamespacedName, mark proxy.Mark) ([]client.Object, error) {
	if d.gone.seen(key) {
		return nil, nil
	}
	var left []client.Object
	for _, obj := range []client.Object{&corev1.Secret{}, &networkingv1.NetworkPolicy{}, &corev1.Service{}, &policyv1.PodDisruptionBudget{}} {
		err := d.live.Get(ctx, key, obj)
		switch {
		case kerrors.IsNotFound(err) || kerrors.IsForbidden(err) && (kindOf(obj) == "NetworkPolicy" || kindOf(obj) == "PodDisruptionBudget"):
			// A cluster without NetworkPolicies or budgets granted has
			// none of ours.
			continue
		case err != nil:
			return nil, fmt.Errorf("cannot get %s %s/%s: %w", kindOf(obj), key.Namespace, key.Name, err)
		}
		if obj.GetDeletionTimestamp() == nil && childOwned(obj, nil, mark) == nil {
			left = append(left, obj)
		}
	}
	return left, nil
}

// leftoversInstance reports left as the instance of the resource being
// deleted, Stopped, so that it stays until Delete has removed them.
func leftoversInstance(key types.NamespacedName, mark proxy.Mark, left []client.Object) proxy.Instance {
	names := make([]string, len(left))
	for i, o := range left {
		names[i] = kindOf(o)
	}
	return proxy.Instance{
		ID:       instanceID(key.Namespace, key.Name),
		Name:     key.Name,
		Mark:     mark,
		State:    proxy.StateStopped,
		Progress: fmt.Sprintf("being deleted: the Deployment is gone, its %s remain without it", strings.Join(names, ", ")),
		Details:  map[string]string{"namespace": key.Namespace, "deployment": key.Name, "leftovers": strings.Join(names, ",")},
	}
}

// deleteLeftovers deletes left, each only as it was read (its UID).
func (d *Driver) deleteLeftovers(ctx context.Context, left []client.Object) error {
	for _, o := range left {
		uid := o.GetUID()
		if err := d.client.Delete(ctx, o, client.Preconditions{UID: &uid}); err != nil && !kerrors.IsNotFound(err) {
			if kerrors.IsConflict(err) {
				return proxy.Transientf("%s %s/%s changed while being deleted; will retry", kindOf(o), o.GetNamespace(), o.GetName())
			}
			return fmt.Errorf("cannot delete %s %s/%s: %w", kindOf(o), o.GetNamespace(), o.GetName(), err)
		}
		d.logger(ctx).V(1).Info("deleted a child left without its Deployment", "kind", kindOf(o), "namespace", o.GetNamespace(), "name", o.GetName())
	}
	return nil
}
