package kubernetes_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// leftoverTests: what a proxy leaves when its Deployment goes without the
// provider, on the real API server with its garbage collector and
// ReplicaSet controller.
func (e *env) leftoverTests(t *testing.T) {
	ctx := context.Background()

	// kubectl delete deployment --cascade=orphan: the ReplicaSet is left
	// owned by nothing and keeps the pod running for good, the Secret and
	// (its NetworkPolicy, where there is one) are left too. List reports them (the sweep's view);
	// the resource's deletion removes them, the ReplicaSet first (with a
	// UID precondition), and ends.
	t.Run("DeploymentDeletedWithItsChildrenOrphaned", func(t *testing.T) {
		t.Parallel()
		ns, d, req := e.fresh(t, "cascade-orphan")
		inst := e.createSettled(t, d, req)
		dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: req.Name}}
		if err := e.live.Delete(ctx, dep, client.PropagationPolicy(metav1.DeletePropagationOrphan)); err != nil {
			t.Fatal(err)
		}
		sel := client.MatchingLabels{kubernetes.LabelName: req.Name}
		testenv.WaitFor(t, "the Deployment gone and its ReplicaSet owned by nothing", time.Minute, func() (bool, string) {
			err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: req.Name}, &appsv1.Deployment{})
			rs := &appsv1.ReplicaSetList{}
			if lerr := e.live.List(ctx, rs, client.InNamespace(ns), sel); lerr != nil || len(rs.Items) != 1 {
				return false, fmt.Sprintf("ReplicaSets: %v, %d", lerr, len(rs.Items))
			}
			return kerrors.IsNotFound(err) && len(rs.Items[0].OwnerReferences) == 0, fmt.Sprintf("Deployment: %v; ReplicaSet owners %v", err, rs.Items[0].OwnerReferences)
		})
		if err := e.waitCache(ctx, ns, req.Name, true); err != nil {
			t.Fatal(err)
		}
		l, err := d.List(ctx, testInstallation)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(l, func(i proxy.Instance) bool { return i.Name == req.Name })
		if i < 0 {
			t.Fatalf("List = %+v; want what %s left reported", l, req.Name)
		}
		left := strings.Join(l[i].Leftovers, ", ")
		if l[i].Mark != req.Mark || l[i].ID != inst.ID || !strings.Contains(left, "ReplicaSet "+ns+"/"+req.Name+"-") ||
			!strings.Contains(left, "Secret "+ns+"/"+req.Name) {
			t.Errorf("List reports %+v; want the resource's mark and ID, its ReplicaSet and Secret", l[i])
		}
		if other, err := d.List(ctx, "another-installation"); err != nil || len(other) != 0 {
			t.Errorf("List of another installation = %+v, %v; want nothing", other, err)
		}

		e.deleteToTheEnd(t, d, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark})
		for _, l := range []client.ObjectList{&appsv1.ReplicaSetList{}, &corev1.PodList{}, &corev1.SecretList{}, &networkingv1.NetworkPolicyList{}} {
			if err := e.live.List(ctx, l, client.InNamespace(ns), sel); err != nil {
				t.Fatal(err)
			}
			if items, _ := metaItems(l); len(items) > 0 {
				// A pod may still be terminating: its ReplicaSet is gone.
				if _, pods := l.(*corev1.PodList); pods && allDeleting(items) {
					continue
				}
				t.Errorf("after the deletion, left: %T %v", l, items)
			}
		}
	})

	// A cluster-scoped PodProxy in the provider's own cluster owns its
	// Deployment (Exposure.Owner): removed without the provider (its
	// finalizer bypassed), the garbage collector removes the Deployment,
	// its ReplicaSet, pod and children.
	t.Run("ClusterScopedPodProxyOwnsItsDeployment", func(t *testing.T) {
		t.Parallel()
		ns, d, req := e.fresh(t, "owned-by-resource")
		pp := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "proxy.egressproxy.io/v1alpha1", "kind": "PodProxy",
			"metadata": map[string]any{"name": "owner-" + ns},
			"spec": map[string]any{
				"providerConfigRef": map[string]any{"name": "pods"},
				"forProvider":       map[string]any{"proxy": map[string]any{"allowedClientCIDRs": []any{"10.0.0.0/8"}}},
			},
		}}
		if err := e.live.Create(ctx, pp); err != nil {
			t.Fatal(err)
		}
		req.Mark.UID = string(pp.GetUID())
		req.Extension = kubernetes.Exposure{Owner: &kubernetes.Owner{APIVersion: "proxy.egressproxy.io/v1alpha1", Kind: "PodProxy", Name: pp.GetName(), UID: string(pp.GetUID())}}
		e.createSettled(t, d, req)
		dep := &appsv1.Deployment{}
		if err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: req.Name}, dep); err != nil {
			t.Fatal(err)
		}
		if o := dep.OwnerReferences; len(o) != 1 || o[0].UID != pp.GetUID() || o[0].Kind != "PodProxy" || (o[0].Controller != nil && *o[0].Controller) {
			t.Fatalf("the Deployment's owners = %+v; want the PodProxy alone, not as controller", o)
		}
		if err := e.live.Delete(ctx, pp); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the garbage collector to remove the Deployment and its Secret", time.Minute, func() (bool, string) {
			derr := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: req.Name}, &appsv1.Deployment{})
			serr := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: req.Name}, &corev1.Secret{})
			return kerrors.IsNotFound(derr) && kerrors.IsNotFound(serr), fmt.Sprintf("Deployment: %v; Secret: %v", derr, serr)
		})
	})
}

// metaItems are the items of l.
func metaItems(l client.ObjectList) ([]metav1.Object, error) {
	var out []metav1.Object
	switch l := l.(type) {
	case *appsv1.ReplicaSetList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	case *corev1.PodList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	case *corev1.SecretList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	case *networkingv1.NetworkPolicyList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	}
	return out, nil
}

func allDeleting(items []metav1.Object) bool {
	for _, o := range items {
		if o.GetDeletionTimestamp() == nil {
			return false
		}
	}
	return true
}
