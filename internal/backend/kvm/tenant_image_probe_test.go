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

// TestTenantImageReportsAnAddressTheTenantGuardRefuses: a tenant's proxy
// on a ClusterProviderConfig boots the tenant's own image (allowTenantImageURLs);
// its guest agent, the tenant's, reports the cluster's kubernetes Service
// with the API server's port. The provider does not probe there: the
// proxy is not Ready, its progress says the reported address is refused,
// and nothing that address would answer is quoted. A catalogue image's
// VM on the same config is probed as the platform's.
func TestTenantImageReportsAnAddressTheTenantGuardRefuses(t *testing.T) {
	tenant := netguard.New(netguard.Options{Denied: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}, ContentAllowed: []netip.Prefix{mirrorRange}})
	for _, byURL := range []bool{true, false} {
		e := newTestEnv(t, func(e *testEnv) {
			e.cfg.Guard = nil       // a ClusterProviderConfig
			e.cfg.URLGuard = tenant // a proxy's own image URL is a tenant's
			e.cfg.Images["debian"] = Image{URL: mirrorURL, SHA256: e.images.sha()}
		})
		e.throughProxy(e.images.Listener.Addr().String())
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
		req := e.request("web", "6f1c2a7e-3b4d-4c5e-9f60-718293a4b5c6")
		if byURL {
			req.Placement.Image = mirrorURL
		}
		req.Proxy.Port = 6443
		inst := e.mustCreate(req)
		if err := e.settle(context.Background(), inst.ID); err != nil {
			t.Fatal(err)
		}
		got := e.mustGet(ref(inst))
		mu.Lock()
		n := len(dialled)
		mu.Unlock()
		if !byURL {
			if n == 0 {
				t.Errorf("a catalogue image's VM was not probed (progress %q)", got.Progress)
			}
			continue
		}
		if n != 0 || got.ProxyReachable || !strings.Contains(got.Progress, "does not connect to 10.96.0.1 for tenants") || strings.Contains(got.Progress, "namespaced") {
			t.Errorf("a tenant's image reporting 10.96.0.1:6443: dialled %v, reachable %v, progress %q; want no dial and a refusal", dialled, got.ProxyReachable, got.Progress)
		}
	}
}
