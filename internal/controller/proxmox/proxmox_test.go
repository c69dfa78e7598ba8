package proxmox

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	backend "github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
)

// TestDriverGetsTheTenantGuard: the driver of a ClusterProviderConfig
// (no Guard of its own) is given the tenant guard, which it dials the
// address a tenant's guest reports through (Ref.TenantGuest); and the
// block says the address is the guest's, so the controller marks such
// requests.
func TestDriverGetsTheTenantGuard(t *testing.T) {
	tenant := netguard.New(netguard.Options{})
	var got backend.Options
	k := New(nil, Options{Driver: func(o *backend.Options) { got = *o }})
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "crossplane-system", Name: "pve"}, Data: map[string][]byte{"token": []byte("root@pam!egress=00000000-0000-0000-0000-000000000000")}}
	kube := fake.NewClientBuilder().WithObjects(sec).Build()
	cfg := &external.Config{
		Name: "ClusterProviderConfig pve",
		Spec: spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{URL: "https://pve.example:8006", Nodes: []string{"pve1"},
			Credentials: spec.ProxmoxCredentials{TokenSecretRef: spec.SecretKeySelector{Namespace: "crossplane-system", Name: "pve", Key: "token"}}}},
		Secrets:     external.Secrets{Kube: kube},
		TenantGuard: tenant,
	}
	if _, err := k.Backend.Connect(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if got.Config.Guard != nil || got.Config.TenantGuard != tenant {
		t.Errorf("driver config: Guard %p, TenantGuard %p; want none and the tenant guard %p", got.Config.Guard, got.Config.TenantGuard, tenant)
	}
	if b, ok := k.Backend.Block(&cfg.Spec); !ok || !b.GuestReportsAddress {
		t.Errorf("Block() = %+v, %v; want GuestReportsAddress", b, ok)
	}
}
