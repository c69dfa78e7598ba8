package proxmox_test

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestTenantGuestReportsAnAddressTheTenantGuardRefuses: a tenant's proxy
// on a ClusterProviderConfig runs the tenant's own cloud-init
// (allowTenantCloudInit), which makes the guest agent report the
// cluster's kubernetes Service as the VM's address. The controller marks
// the request TenantGuest; the provider then does not probe there: the
// proxy is not Ready, its progress says the reported address is refused,
// and nothing that address would answer is quoted. Without the mark (the
// platform's cloud-init) the address is probed as the platform's.
func TestTenantGuestReportsAnAddressTheTenantGuardRefuses(t *testing.T) {
	for _, tc := range []struct {
		name        string
		tenantGuest bool
	}{
		{name: "tenant's cloud-init", tenantGuest: true},
		{name: "platform's guest", tenantGuest: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var asked []string
			f := newFixture(t, withConfig(func(c *proxmox.Config) {
				c.Guard = nil // a ClusterProviderConfig
				// The fake's guests are on loopback, which the platform
				// opens here; the cluster's Service network stays refused.
				c.TenantGuard = netguard.New(netguard.Options{
					Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
					Denied:  []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
				})
			}))
			ask := f.opts.Prober.Ask
			f.opts.Prober.Ask = func(ctx context.Context, addr string) (string, error) {
				mu.Lock()
				asked = append(asked, addr)
				mu.Unlock()
				return ask(ctx, addr)
			}
			req := f.request("web", "5d2e8f14-6a3b-4c7d-8e9f-0a1b2c3d4e5f")
			req.CloudInit = "#cloud-config\nruncmd: [true]\n"
			req.TenantGuest = tc.tenantGuest
			inst, err := f.rec.Create(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.settle(context.Background(), inst.ID); err != nil {
				t.Fatal(err)
			}
			f.fake.SetGuestAddress(vmidOf(t, inst.ID), "10.96.0.1")
			mu.Lock()
			asked = nil
			mu.Unlock()
			ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement, Live: true, TenantGuest: tc.tenantGuest}
			got, err := f.drv.Get(context.Background(), ref)
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			n := len(asked)
			mu.Unlock()
			if !tc.tenantGuest {
				if n == 0 {
					t.Errorf("the platform's guest was not probed (progress %q)", got.Progress)
				}
				return
			}
			// On the platform's config, the refusal gives no namespaced
			// config as its reason.
			if n != 0 || got.ProxyReachable || got.ProxyAddress != "" || !strings.Contains(got.Progress, "does not connect to 10.96.0.1 for tenants") ||
				strings.Contains(got.Progress, "namespaced") || strings.Contains(got.Progress, "connection refused") {
				t.Errorf("a tenant's guest reporting 10.96.0.1: asked %v, reachable %v, address %q, progress %q; want no probe and a quiet refusal", asked, got.ProxyReachable, got.ProxyAddress, got.Progress)
			}
		})
	}
}
