package external

import (
	"context"
	"fmt"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/egressproxy/provider-egressproxy/apis"
	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
)

// TestChildrenFinalizer: once the resource is being deleted, removing its
// finalizer first deletes its connection Secret and its usage, but only
// those it controls; a resource not being deleted loses nothing.
func TestChildrenFinalizer(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := apis.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	owner := func(cr *nsproxy.KVMProxy) []metav1.OwnerReference {
		return []metav1.OwnerReference{meta.AsController(meta.TypedReferenceTo(cr, nsproxy.KVMProxyGroupVersionKind))}
	}
	secret := func(name string, owners []metav1.OwnerReference) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, OwnerReferences: owners}}
	}
	usage := func(owners []metav1.OwnerReference) *namespacedv1alpha1.ProviderConfigUsage {
		return &namespacedv1alpha1.ProviderConfigUsage{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: testUID, OwnerReferences: owners}}
	}
	other := proxyResource(func(cr *nsproxy.KVMProxy) { cr.UID = "someone-else" })

	cases := map[string]struct {
		cr       *nsproxy.KVMProxy
		existing []client.Object
		want     []string // what is left, kind/name
	}{
		"BeingDeletedItsOwnGo": {
			cr:       proxyResource(deleting, withConnectionSecret("web-conn")),
			existing: []client.Object{secret("web-conn", owner(proxyResource())), usage(owner(proxyResource()))},
			want:     nil,
		},
		"BeingDeletedSomeoneElsesStay": {
			cr:       proxyResource(deleting, withConnectionSecret("web-conn")),
			existing: []client.Object{secret("web-conn", owner(other)), usage(nil)},
			want:     []string{"Secret/web-conn", "ProviderConfigUsage/" + testUID},
		},
		"BeingDeletedNoConnectionSecretAsked": {
			cr:       proxyResource(deleting),
			existing: []client.Object{secret("web-conn", owner(proxyResource())), usage(owner(proxyResource()))},
			want:     []string{"Secret/web-conn"},
		},
		"NotBeingDeletedNothingGoes": {
			cr:       proxyResource(withConnectionSecret("web-conn")),
			existing: []client.Object{secret("web-conn", owner(proxyResource())), usage(owner(proxyResource()))},
			want:     []string{"Secret/web-conn", "ProviderConfigUsage/" + testUID},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			meta.AddFinalizer(tc.cr, "finalizer.managedresource.crossplane.io")
			kube := fake.NewClientBuilder().WithScheme(s).WithObjects(append(tc.existing, tc.cr)...).Build()
			f := childrenFinalizer{Finalizer: resource.NewAPIFinalizer(kube, "finalizer.managedresource.crossplane.io"), kube: kube}
			if err := f.RemoveFinalizer(context.Background(), tc.cr); err != nil && !kerrors.IsNotFound(err) {
				t.Fatalf("RemoveFinalizer: %v", err)
			}
			var left []string
			for _, o := range tc.existing {
				got := o.DeepCopyObject().(client.Object) //nolint:forcetypeassert // a copy of a client.Object.
				if err := kube.Get(context.Background(), client.ObjectKeyFromObject(o), got); err == nil {
					left = append(left, kindName(o)+"/"+o.GetName())
				}
			}
			if diff := cmp.Diff(tc.want, left); diff != "" {
				t.Errorf("objects left (-want +got):\n%s", diff)
			}
			if meta.FinalizerExists(tc.cr, "finalizer.managedresource.crossplane.io") {
				t.Error("the finalizer is still on the resource")
			}
		})
	}
}

func kindName(o client.Object) string {
	if _, ok := o.(*corev1.Secret); ok {
		return "Secret"
	}
	return "ProviderConfigUsage"
}

func withConnectionSecret(name string) func(*nsproxy.KVMProxy) {
	return func(cr *nsproxy.KVMProxy) {
		cr.SetWriteConnectionSecretToReference(&xpv2.LocalSecretReference{Name: name})
	}
}

// TestControlledChildrenOfAClusterScopedResource: a cluster-scoped
// resource's connection Secret is in the namespace its reference names,
// and its usage is the cluster-scoped kind, named after its UID.
func TestControlledChildrenOfAClusterScopedResource(t *testing.T) {
	cr := &clusterproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Name: "web", UID: testUID}}
	cr.SetWriteConnectionSecretToReference(&xpv2.SecretReference{Namespace: "crossplane-system", Name: "web-conn"})
	var got []string
	for _, o := range controlledChildren(cr) {
		got = append(got, fmt.Sprintf("%T %s/%s", o, o.GetNamespace(), o.GetName()))
	}
	want := []string{"*v1.Secret crossplane-system/web-conn", "*v1alpha1.ProviderConfigUsage /" + testUID}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("children (-want +got):\n%s", diff)
	}
	if _, ok := controlledChildren(cr)[1].(*clusterv1alpha1.ProviderConfigUsage); !ok {
		t.Errorf("the usage of a cluster-scoped resource is %T, want the cluster-scoped kind", controlledChildren(cr)[1])
	}
}
