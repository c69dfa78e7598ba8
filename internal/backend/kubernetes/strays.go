package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// strays are the ReplicaSets and pods of the proxy key names, carrying
// mark, that nothing live owns: a Deployment deleted with
// --cascade=orphan leaves its ReplicaSet without an owner, and the
// ReplicaSet keeps its pod running for good; a ReplicaSet deleted so
// leaves its pods. The garbage collector never removes them. A pod whose
// ReplicaSet is owned by something, or is being deleted, is the garbage
// collector's and not listed. Read from the API server: the cache strips
// pods' owners.
func (d *Driver) strays(ctx context.Context, key types.NamespacedName, mark proxy.Mark) ([]client.Object, error) {
	if mark.UID == "" || mark.InstallationID == "" {
		return nil, nil
	}
	sel := client.MatchingLabels{LabelManagedBy: ManagedBy, LabelName: key.Name, LabelUID: mark.UID, LabelInstallation: mark.InstallationID}
	pods := &corev1.PodList{}
	if err := d.live.List(ctx, pods, client.InNamespace(key.Namespace), sel); err != nil {
		return nil, fmt.Errorf("cannot list the pods of %s/%s: %w", key.Namespace, key.Name, err)
	}
	var out []client.Object
	seen := map[types.UID]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		c := metav1.GetControllerOf(p)
		if c == nil {
			out = append(out, p)
			continue
		}
		if c.Kind != "ReplicaSet" || seen[c.UID] {
			continue
		}
		seen[c.UID] = true
		rs := &appsv1.ReplicaSet{}
		err := d.live.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: c.Name}, rs)
		switch {
		case kerrors.IsNotFound(err):
			continue // gone: its pods are the garbage collector's
		case kerrors.IsForbidden(err):
			return nil, proxy.Permanentf("pod %s/%s of this proxy is kept by ReplicaSet %s, which this config's identity may not read: grant get and delete on replicasets (docs/pod-proxy.md)",
				key.Namespace, p.Name, c.Name)
		case err != nil:
			return nil, fmt.Errorf("cannot get ReplicaSet %s/%s: %w", key.Namespace, c.Name, err)
		}
		l := rs.Labels
		if rs.UID != c.UID || rs.DeletionTimestamp != nil || len(rs.OwnerReferences) > 0 ||
			l[LabelManagedBy] != ManagedBy || l[LabelUID] != mark.UID || l[LabelInstallation] != mark.InstallationID {
			continue
		}
		out = append(out, rs)
	}
	return out, nil
}

// deleteStrays deletes strays, each only as it was read (its UID); a
// ReplicaSet in the background, so that the garbage collector removes its
// pods.
func (d *Driver) deleteStrays(ctx context.Context, strays []client.Object) error {
	for _, o := range strays {
		uid := o.GetUID()
		err := d.client.Delete(ctx, o, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		switch {
		case kerrors.IsNotFound(err):
		case kerrors.IsConflict(err):
			return proxy.Transientf("%s %s/%s changed while being deleted; will retry", kindOf(o), o.GetNamespace(), o.GetName())
		case kerrors.IsForbidden(err):
			return proxy.Permanentf("%s %s/%s of this proxy is owned by nothing and keeps running; this config's identity may not delete it: grant delete on %ss (docs/pod-proxy.md), or delete it by hand",
				kindOf(o), o.GetNamespace(), o.GetName(), strings.ToLower(kindOf(o)))
		case err != nil:
			return fmt.Errorf("cannot delete %s %s/%s: %w", kindOf(o), o.GetNamespace(), o.GetName(), err)
		}
		d.logger(ctx).Info("deleted a stray of a proxy whose Deployment is gone", "kind", kindOf(o), "namespace", o.GetNamespace(), "name", o.GetName())
	}
	return nil
}

// listLeftovers are the objects in the config's namespace carrying
// installationID's mark that stand without their Deployment (deps names
// the Deployments there): Secrets, NetworkPolicies and Services owned by
// nothing, and stray ReplicaSets and pods; one entry per proxy name and
// UID. Objects with an owner are the garbage collector's. Secrets and
// NetworkPolicies are listed only where the config's identity may list
// them (a Forbidden list is skipped). It returns besides every Secret and
// NetworkPolicy listed, owned or not, by kind (noteAbsent reads them); a
// kind whose list was refused is left out.
func (d *Driver) listLeftovers(ctx context.Context, installationID string, deps map[string]bool) ([]proxy.Instance, map[string][]client.Object, error) {
	ns := d.cfg.Namespace
	children := map[string][]client.Object{}
	sel := client.MatchingLabels{LabelManagedBy: ManagedBy, LabelInstallation: installationID}
	type key struct{ name, uid string }
	byKey := map[key]*proxy.Instance{}
	var keys []key
	add := func(o client.Object, name string) {
		uid := o.GetLabels()[LabelUID]
		if name == "" || uid == "" || deps[name] || o.GetDeletionTimestamp() != nil {
			return
		}
		k := key{name, uid}
		e, ok := byKey[k]
		if !ok {
			e = &proxy.Instance{ID: instanceID(ns, name), Name: name, Mark: proxy.Mark{UID: uid, InstallationID: installationID}, State: proxy.StateStopped,
				Details: map[string]string{"namespace": ns, "deployment": name}}
			byKey[k] = e
			keys = append(keys, k)
		}
		if t := o.GetCreationTimestamp().Time; !t.IsZero() && (e.CreatedAt.IsZero() || t.Before(e.CreatedAt)) {
			e.CreatedAt = t.UTC()
		}
		e.Leftovers = append(e.Leftovers, kindOf(o)+" "+ns+"/"+o.GetName())
	}
	// Owned by nothing: the children of a Deployment deleted with its
	// children orphaned.
	for _, l := range []client.ObjectList{&corev1.SecretList{}, &networkingv1.NetworkPolicyList{}, &corev1.ServiceList{}} {
		r := d.live
		if _, svc := l.(*corev1.ServiceList); svc {
			r = d.client // cached where the driver has a cache
		}
		err := r.List(ctx, l, client.InNamespace(ns), sel)
		if kerrors.IsForbidden(err) {
			d.logger(ctx).V(1).Info("kubernetes list: may not list, so cannot report those left without their Deployment", "list", fmt.Sprintf("%T", l))
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("cannot list in %s: %w", ns, err)
		}
		var objs []client.Object
		switch l := l.(type) {
		case *corev1.SecretList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
			children["Secret"] = objs
		case *networkingv1.NetworkPolicyList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
			children["NetworkPolicy"] = objs
		case *corev1.ServiceList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		}
		for _, o := range objs {
			if len(o.GetOwnerReferences()) == 0 {
				add(o, o.GetName())
			}
		}
	}
	// Pods of no Deployment, from the cache: what keeps them is read
	// only for those.
	pods := &corev1.PodList{}
	if err := d.client.List(ctx, pods, client.InNamespace(ns), sel); err != nil {
		return nil, nil, fmt.Errorf("cannot list the pods in %s: %w", ns, err)
	}
	done := map[key]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		k := key{p.Labels[LabelName], p.Labels[LabelUID]}
		if k.name == "" || k.uid == "" || deps[k.name] || done[k] {
			continue
		}
		done[k] = true
		strays, err := d.strays(ctx, types.NamespacedName{Namespace: ns, Name: k.name}, proxy.Mark{UID: k.uid, InstallationID: installationID})
		if proxy.IsPermanent(err) {
			// Not granted: the rest is still listed.
			d.logger(ctx).V(1).Info("kubernetes list: cannot tell what keeps a proxy's pods", "namespace", ns, "name", k.name, "error", err.Error())
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		for _, o := range strays {
			add(o, k.name)
		}
	}
	out := make([]proxy.Instance, 0, len(keys))
	for _, k := range keys {
		e := byKey[k]
		slices.Sort(e.Leftovers)
		e.Progress = "the Deployment is gone; " + strings.Join(e.Leftovers, ", ") + " remain without it"
		out = append(out, *e)
	}
	return out, children, nil
}
