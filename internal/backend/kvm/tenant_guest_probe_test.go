package kvm

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestTenantGuestReportsAnAddressTheTenantGuardRefuses: a tenant's proxy
// on a ClusterProviderConfig boots a catalogue image with the tenant's own
// cloud-init (allowTenantCloudInit), which rewrites the guest agent to
// report the cluster's kubernetes Service with the API server's port. The
// controller marks the request TenantGuest; the provider then does not
// probe there: the proxy is not Ready, its progress says the reported
// address is refused, and nothing that address would answer is quoted.
// The same VM without the mark (the platform's cloud-init) is probed as
// the platform's.
func TestTenantGuestReportsAnAddressTheTenantGuardRefuses(t *testing.T) {
	tenant := netguard.New(netguard.Options{Denied: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}})
	for _, tc := range []struct {
		name        string
		tenantGuest bool
	}{
		{name: "tenant's cloud-init", tenantGuest: true},
		{name: "platform's guest", tenantGuest: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, func(e *testEnv) {
				e.cfg.Guard = nil       // a ClusterProviderConfig
				e.cfg.URLGuard = tenant // the tenant guard
			})
			var mu sync.Mutex
			var dialled []string
			e.b.prober = &squid.Prober{Wait: time.Minute, PositiveTTL: time.Nanosecond, NegativeTTL: time.Nanosecond,
				Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
					mu.Lock()
					dialled = append(dialled, addr)
					mu.Unlock()
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: &net.AddrError{Err: "connection refused (test)", Addr: addr}}
				}}
			e.host.nextAgentIP = "10.96.0.1"
			req := e.request("web", "0c6f3a52-8d1e-4b7a-9e2f-3a4b5c6d7e8f")
			req.CloudInit = "#cloud-config\nruncmd: [true]\n"
			req.TenantGuest = tc.tenantGuest
			req.Proxy.Port = 6443
			inst := e.mustCreate(req)
			if err := e.settle(context.Background(), inst.ID); err != nil {
				t.Fatal(err)
			}
			r := ref(inst)
			r.TenantGuest = tc.tenantGuest
			got := e.mustGet(r)
			mu.Lock()
			n := len(dialled)
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
				strings.Contains(got.Progress, "namespaced") || strings.Contains(got.Progress, "connection refused (test)") {
				t.Errorf("a tenant's guest reporting 10.96.0.1:6443: dialled %v, reachable %v, address %q, progress %q; want no dial and a quiet refusal", dialled, got.ProxyReachable, got.ProxyAddress, got.Progress)
			}
		})
	}
}
