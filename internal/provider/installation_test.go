package provider

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// noNamespaces is Crossplane's grant: no read of Namespaces.
var noNamespaces = interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Namespace); ok {
		return kerrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, key.Name, nil)
	}
	return c.Get(ctx, key, obj, opts...)
}}

func TestInstallationID(t *testing.T) {
	ctx := context.Background()
	kubeSystem := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: "0123abcd-ffff"}}

	t.Run("FromKubeSystemWhenReadableAndKept", func(t *testing.T) {
		c := fake.NewClientBuilder().WithObjects(kubeSystem).Build()
		id, err := defaultInstallationID(ctx, c, "crossplane-system")
		if err != nil || id != "k0123abcd" {
			t.Fatalf("got %q, %v; want k0123abcd (what earlier versions used)", id, err)
		}
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "crossplane-system", Name: installationConfigMap}, cm); err != nil || cm.Data["id"] != id {
			t.Errorf("ConfigMap: %v %v; want data.id %s", cm.Data, err, id)
		}
	})

	t.Run("RandomUnderCrossplanesRBACAndStable", func(t *testing.T) {
		c := fake.NewClientBuilder().WithObjects(kubeSystem).WithInterceptorFuncs(noNamespaces).Build()
		id, err := defaultInstallationID(ctx, c, "crossplane-system")
		if err != nil || !strings.HasPrefix(id, "r") || len(id) != 9 {
			t.Fatalf("got %q, %v; want r and 8 hex characters", id, err)
		}
		again, err := defaultInstallationID(ctx, c, "crossplane-system")
		if err != nil || again != id {
			t.Errorf("second start: %q, %v; want the same %q", again, err, id)
		}
	})

	t.Run("EmptyConfigMapNamesTheFix", func(t *testing.T) {
		c := fake.NewClientBuilder().WithObjects(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: installationConfigMap}}).Build()
		if _, err := defaultInstallationID(ctx, c, "ns"); err == nil || !strings.Contains(err.Error(), "has no data.id") || !strings.Contains(err.Error(), "--installation-id") {
			t.Errorf("got %v", err)
		}
	})
}
