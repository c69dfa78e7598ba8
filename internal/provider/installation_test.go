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

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
)

// noNamespaces is Crossplane's grant: no read of Namespaces.
var noNamespaces = interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Namespace); ok {
		return kerrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, key.Name, nil)
	}
	return c.Get(ctx, key, obj, opts...)
}}

// newFake is a fake client with the provider's scheme.
func newFake(t *testing.T) *fake.ClientBuilder {
	t.Helper()
	s, err := pcontroller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithStatusSubresource()
}

func TestInstallationID(t *testing.T) {
	ctx := context.Background()
	kubeSystem := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: "0123abcd-ffff"}}

	t.Run("FromKubeSystemWhenReadableAndKept", func(t *testing.T) {
		c := newFake(t).WithObjects(kubeSystem).Build()
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
		c := newFake(t).WithObjects(kubeSystem).WithInterceptorFuncs(noNamespaces).Build()
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
		c := newFake(t).WithObjects(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: installationConfigMap}}).Build()
		if _, err := defaultInstallationID(ctx, c, "ns"); err == nil || !strings.Contains(err.Error(), "has no data.id") || !strings.Contains(err.Error(), "--installation-id") {
			t.Errorf("got %v", err)
		}
	})

	// The ConfigMap is gone (deleted by hand, a namespace recreated): the
	// ID comes back from the configs' status.installationID, which the
	// health checks write, so the provider's instances stay its own.
	withStatus := func(name, specID, statusID string) *nsv1alpha1.ClusterProviderConfig {
		pc := &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: name}}
		pc.Spec.InstallationID = specID
		pc.Status.InstallationID = statusID
		return pc
	}
	// A namespace's editors may write its ProviderConfigs' status: what
	// it says is not taken, neither to choose the ID nor to disagree.
	forged := func() *nsv1alpha1.ProviderConfig {
		pc := &nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "own", Namespace: "team-a"}}
		pc.Status.InstallationID = "kother001"
		return pc
	}
	t.Run("RecoveredFromTheConfigsStatus", func(t *testing.T) {
		team := forged()
		legacy := &clusterv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "legacy"}}
		legacy.Status.InstallationID = "r1a2b3c4d"
		c := newFake(t).WithObjects(kubeSystem, withStatus("pods", "", "r1a2b3c4d"), withStatus("prod-eu", "prod-eu", "prod-eu"), withStatus("new", "", ""), team, legacy).
			WithInterceptorFuncs(noNamespaces).Build()
		id, err := defaultInstallationID(ctx, c, "crossplane-system")
		if err != nil || id != "r1a2b3c4d" {
			t.Fatalf("got %q, %v; want r1a2b3c4d, the ID the cluster-scoped configs recorded (prod-eu is a config's own)", id, err)
		}
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "crossplane-system", Name: installationConfigMap}, cm); err != nil || cm.Data["id"] != id {
			t.Errorf("ConfigMap made again: %v %v; want data.id %s", cm.Data, err, id)
		}
	})

	t.Run("NotFromANamespacedConfigsStatus", func(t *testing.T) {
		c := newFake(t).WithObjects(kubeSystem, forged(), withStatus("new", "", "")).WithInterceptorFuncs(noNamespaces).Build()
		id, err := defaultInstallationID(ctx, c, "crossplane-system")
		if err != nil || !strings.HasPrefix(id, "r") {
			t.Errorf("got %q, %v; want a new random ID, not the one a namespaced config's status claims", id, err)
		}
	})

	t.Run("RecoveredBeforeKubeSystem", func(t *testing.T) {
		c := newFake(t).WithObjects(kubeSystem, withStatus("pods", "", "r1a2b3c4d")).Build()
		if id, err := defaultInstallationID(ctx, c, "crossplane-system"); err != nil || id != "r1a2b3c4d" {
			t.Errorf("got %q, %v; want the recorded r1a2b3c4d over kube-system's", id, err)
		}
	})

	t.Run("DisagreeingConfigsNameTheFix", func(t *testing.T) {
		c := newFake(t).WithObjects(withStatus("a", "", "r11111111"), withStatus("b", "", "r22222222")).Build()
		_, err := defaultInstallationID(ctx, c, "crossplane-system")
		for _, want := range []string{"does not exist", "r11111111 (ClusterProviderConfig a)", "r22222222 (ClusterProviderConfig b)", "data.id", "--installation-id"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("got %v; want an error saying %q", err, want)
			}
		}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "crossplane-system", Name: installationConfigMap}, &corev1.ConfigMap{}); !kerrors.IsNotFound(err) {
			t.Errorf("a ConfigMap was made from a guess: %v", err)
		}
	})
}
