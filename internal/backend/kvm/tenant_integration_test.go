package kvm_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
)

// TestIntegrationLibvirt_tenantHostMessagesNotQuoted: on the real
// libvirtd behind the real sshd, a config naming a pool the host does not
// have is unhealthy with PoolNotFound either way; libvirtd's own message
// is in the health of a platform config only, the code's name in a
// tenant's (a namespaced config: the guarded dial).
func TestIntegrationLibvirt_tenantHostMessagesNotQuoted(t *testing.T) {
	h := kvmtest.Up(t)
	b := kvm.NewBackend(kvm.Options{})
	t.Cleanup(b.Close)
	host := h.KVMHost("local")
	host.Pool = "egressproxy-no-such-pool"
	tenant := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	for _, guard := range []*netguard.Guard{tenant, nil} {
		d := b.Driver(kvm.Config{Name: "ProviderConfig team-a/kvm", Guard: guard, Credentials: h.Credentials(), Hosts: []kvm.Host{host}})
		th := d.Check(context.Background()).Targets[0]
		t.Logf("guard %v: %s: %s", guard != nil, th.Reason, th.Message)
		quoted := strings.Contains(th.Message, "matching name")
		if th.Reason != kvm.ReasonPoolNotFound || (guard != nil) == quoted {
			t.Errorf("guard %v: Check = %+v; want PoolNotFound, libvirtd's message only for the platform's config", guard != nil, th)
		}
		if guard != nil && !strings.Contains(th.Message, "NoStoragePool") {
			t.Errorf("a tenant's Check = %q; want the code's name", th.Message)
		}
	}
}
