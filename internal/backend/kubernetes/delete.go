package kubernetes

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Delete implements proxy.Driver: it deletes the Secret and the
// NetworkPolicy by the proxy's mark (deleteChildren), then the
// Deployment, and the garbage collector removes what it owns (the
// ReplicaSet and its pod, the Service, the budget, and the Secret and
// NetworkPolicy where the cluster refused deleteChildren). It returns at
// once.
//
// A Deployment whose pod the driver sees goes in the background: it is
// gone at once, and Get of the resource being deleted reports the proxy
// (Stopped) until no pod of it remains (podsLeft), so the resource still
// disappears only once its pod no longer runs, without the garbage
// collector's and the Deployment and ReplicaSet controllers' work of a
// foreground deletion (several times the API requests of a background
// one). One whose pod the driver has not seen yet goes in the
// foreground: a pod its ReplicaSet is about to make would not be waited
// for, and in the foreground the ReplicaSet makes none and the Deployment
// stays until the ReplicaSet and its pods are gone.
func (d *Driver) Delete(ctx context.Context, ref proxy.Ref) error {
	return proxy.RunErr(ctx, proxy.OpDelete, d.wrap, func(ctx context.Context) error { return d.delete(ctx, ref) })
}

func (d *Driver) delete(ctx context.Context, ref proxy.Ref) error {
	dep, err := d.deployment(ctx, ref)
	switch {
	case proxy.IsNotFound(err):
		// Gone; Get reports its pods until they are. What it left without
		// an owner is removed here.
		return d.deleteOrphans(ctx, ref)
	case err != nil:
		return err
	case dep.DeletionTimestamp != nil:
		return nil // on its way
	}
	if err := owned(dep, ref.Mark, "delete"); err != nil {
		return err
	}
	pods, err := d.pods(ctx, dep.Namespace, markOf(dep), dep.Labels[LabelName])
	if err != nil {
		return err
	}
	policy := metav1.DeletePropagationForeground
	if len(pods) > 0 {
		policy = metav1.DeletePropagationBackground
	}
	d.deleteChildren(ctx, dep, ref.Mark)
	err = d.client.Delete(ctx, dep,
		client.PropagationPolicy(policy),
		// Never delete a Deployment of the same name made since the read.
		client.Preconditions{UID: &dep.UID})
	if err != nil && !kerrors.IsNotFound(err) {
		if kerrors.IsConflict(err) {
			return proxy.Transientf("Deployment %s/%s changed while being deleted; will retry", dep.Namespace, dep.Name)
		}
		return fmt.Errorf("cannot delete Deployment %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	d.logger(ctx).V(1).Info("deleted Deployment", "namespace", dep.Namespace, "name", dep.Name, "propagation", policy)
	return nil
}

// deleteChildren deletes the Secret and the NetworkPolicy of dep's proxy
// with one deletecollection each, selecting the proxy's whole mark and
// the name the driver gave them: nothing without both is touched (a mark
// is labels, which whoever may write an object can copy onto it), and
// nothing is read first. Otherwise the garbage
// collector reads each of them and the Deployment, then deletes it, and
// reads the Deployment again when a burst of deletes outgrows its cache
// of absent owners. It runs before the Deployment is deleted, which is
// what starts the collector on them.
//
// Best effort: a refusal (RBAC, or a server without the verb) leaves them
// to the collector, and is remembered a while (refused) so that the next
// deletes do not ask again; any other error leaves them to the collector
// too.
func (d *Driver) deleteChildren(ctx context.Context, dep *appsv1.Deployment, mark proxy.Mark) {
	if mark.UID == "" || mark.InstallationID == "" {
		return
	}
	sel := client.MatchingLabels{LabelManagedBy: ManagedBy, LabelName: dep.Name, LabelUID: mark.UID, LabelInstallation: mark.InstallationID}
	named := client.MatchingFields{"metadata.name": dep.Name}
	children := []client.Object{&corev1.Secret{}}
	if d.cfg.NetworkPolicy {
		children = append(children, &networkingv1.NetworkPolicy{})
	}
	// At once, not one after the other: the Deployment waits for them.
	var wg sync.WaitGroup
	for _, obj := range children {
		k := refusedKey{namespace: dep.Namespace, resource: kindOf(obj)}
		if d.refused.recent(k, d.now()) {
			continue
		}
		wg.Go(func() {
			log := d.logger(ctx).V(1).WithValues("kind", kindOf(obj), "namespace", dep.Namespace, "name", dep.Name)
			err := d.client.DeleteAllOf(ctx, obj, client.InNamespace(dep.Namespace), sel, named)
			switch {
			case err == nil:
				log.Info("deleted by the proxy's mark")
			case refusal(err):
				d.refused.add(k, d.now())
				// Once per refusedTTL: worth seeing without debug logs.
				d.logger(ctx).Info("deletecollection refused; the garbage collector deletes the proxy's children instead (docs/pod-proxy.md, RBAC in the target cluster)",
					"kind", kindOf(obj), "namespace", dep.Namespace, "for", refusedTTL.String(), "error", d.quietly(err).Error())
			default:
				log.Info("cannot delete by the proxy's mark; left to the garbage collector", "error", d.quietly(err).Error())
			}
		})
	}
	wg.Wait()
}

// refusal says err refuses a deletecollection for good: RBAC, or a server
// that lacks the verb or the resource.
func refusal(err error) bool {
	return kerrors.IsForbidden(err) || kerrors.IsMethodNotSupported(err) || kerrors.IsNotFound(err) || meta.IsNoMatchError(err)
}

// strayGrace is how long the pods of a Deployment the watch saw deleted
// are left to the garbage collector, which removes them within seconds,
// before what keeps them is read live (strays): a proxy deleted the usual
// way costs no such reads.
const strayGrace = 30 * time.Second

// deleteOrphans deletes the children ref's proxy left without its
// Deployment (leftovers), for a resource whose mark is known.
func (d *Driver) deleteOrphans(ctx context.Context, ref proxy.Ref) error {
	if ref.Mark.UID == "" || ref.Mark.InstallationID == "" {
		return nil
	}
	key, err := d.key(ref)
	if err != nil {
		return err
	}
	// While its pods remain, the garbage collector is at work, unless
	// what keeps them is owned by nothing (strays).
	if pods, err := d.pods(ctx, key.Namespace, ref.Mark, key.Name); err != nil || len(pods) > 0 {
		if err != nil {
			return err
		}
		if ago, ok := d.gone.since(key); ok && ago < strayGrace {
			return nil
		}
		strays, err := d.strays(ctx, key, ref.Mark)
		if err != nil {
			return err
		}
		return d.deleteStrays(ctx, strays)
	}
	left, err := d.leftovers(ctx, key, ref.Mark)
	if err != nil {
		return err
	}
	return d.deleteLeftovers(ctx, left)
}

// pods are the pods carrying mark and the name label name in namespace,
// from the cache where the driver has one.
func (d *Driver) pods(ctx context.Context, namespace string, mark proxy.Mark, name string) ([]corev1.Pod, error) {
	l := &corev1.PodList{}
	if err := d.podsOf(ctx, l, namespace, client.MatchingLabels{
		LabelManagedBy: ManagedBy, LabelName: name, LabelUID: mark.UID, LabelInstallation: mark.InstallationID,
	}); err != nil {
		return nil, fmt.Errorf("cannot list the pods of %s/%s: %w", namespace, name, err)
	}
	return l.Items, nil
}

// podsLeft reports, for a resource being deleted whose Deployment is gone,
// the pods of it that remain (the garbage collector removes them after
// their ReplicaSet, and a pod stops only after its grace period) as the
// instance, Stopped, so that the resource stays until they are gone;
// NotFound once none remains. The cache is enough: the pods of a
// Deployment that went in the background are only ever deleted from here
// on, and a cache that lags shows a pod that has gone, never misses one
// that exists (see Delete for a pod not yet made).
func (d *Driver) podsLeft(ctx context.Context, key types.NamespacedName, ref proxy.Ref) (proxy.Instance, error) {
	gone := proxy.NotFoundf("Deployment %s/%s not found", key.Namespace, key.Name)
	if ref.Mark.UID == "" || ref.Mark.InstallationID == "" {
		return proxy.Instance{}, gone
	}
	pods, err := d.pods(ctx, key.Namespace, ref.Mark, key.Name)
	if err != nil {
		return proxy.Instance{}, err
	}
	if len(pods) == 0 {
		left, err := d.leftovers(ctx, key, ref.Mark)
		if err != nil {
			return proxy.Instance{}, err
		}
		if len(left) > 0 {
			return leftoversInstance(key, ref.Mark, left), nil
		}
		return proxy.Instance{}, gone
	}
	d.logger(ctx).V(1).Info("Deployment gone, its pod remains", "namespace", key.Namespace, "name", key.Name, "pod", pods[0].Name)
	return proxy.Instance{
		ID:       instanceID(key.Namespace, key.Name),
		Name:     key.Name,
		Mark:     ref.Mark,
		State:    proxy.StateStopped,
		Progress: fmt.Sprintf("being deleted: the Deployment is gone, pod %s is stopping", pods[0].Name),
		Details:  map[string]string{"namespace": key.Namespace, "deployment": key.Name, "pod": pods[0].Name},
	}, nil
}

// podsOf lists into l the pods in namespace carrying labels, whose
// LabelUID is the proxy's: through the cache's index of the proxy's UID
// where there is one.
func (d *Driver) podsOf(ctx context.Context, l *corev1.PodList, namespace string, labels client.MatchingLabels) error {
	opts := []client.ListOption{client.InNamespace(namespace), labels}
	if uid := labels[LabelUID]; d.podIndex && uid != "" {
		opts = append(opts, client.MatchingFields{podUIDIndex: uid})
	}
	return d.client.List(ctx, l, opts...)
}
