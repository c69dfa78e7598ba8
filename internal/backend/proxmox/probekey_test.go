package proxmox_test

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestAnotherConfigsReadOfAVMLeavesItsProbeAlone: every proxmox driver
// shares one readiness prober. A tenant's ProviderConfig naming the
// platform's cluster, with a token that can see the platform's VMs, reads
// a platform proxy's VM by its name (an Observe-only import, which the
// controller then refuses): that read must not take the platform proxy's
// place in the prober, whose answer stays its own.
func TestAnotherConfigsReadOfAVMLeavesItsProbeAlone(t *testing.T) {
	cases := map[string]struct {
		reason      string
		tenantReads int
		want        bool
	}{
		"NoTenantRead": {
			reason: "The platform proxy's second Get answers from its own probe.",
			want:   true,
		},
		"TenantReadsBetween": {
			reason:      "The tenant's reads of the VM leave the platform proxy's probe as it was.",
			tenantReads: 3,
			want:        true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var (
				mu     sync.Mutex
				silent bool
			)
			var ask func(context.Context, string) (string, error)
			prober := &squid.Prober{Wait: time.Minute, PositiveTTL: time.Hour, NegativeTTL: time.Nanosecond,
				Ask: func(ctx context.Context, addr string) (string, error) {
					mu.Lock()
					off := silent
					mu.Unlock()
					if off {
						return "", errors.New("connection refused")
					}
					return ask(ctx, addr)
				}}
			f := newFixture(t, func(o *fixtureOptions) { o.driver = func(d *proxmox.Options) { d.Prober = prober } })
			ask = f.fake.AskSquid

			req := f.request("web", "uid-platform")
			inst, err := f.rec.Create(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.settle(ctx, inst.ID); err != nil {
				t.Fatal(err)
			}
			own := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement}
			if got, err := f.drv.Get(ctx, own); err != nil || !got.ProxyReachable {
				t.Fatalf("platform Get = %+v, %v; want its proxy answering", got, err)
			}

			o := f.opts
			o.Shared = nil
			o.Provider = "ProviderConfig team-a/pve"
			o.Config.Guard = netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
			tenant, err := proxmox.New(o)
			if err != nil {
				t.Fatal(err)
			}
			imp := proxy.Ref{Name: req.Name, Mark: proxy.Mark{UID: "uid-tenant", InstallationID: testInstallation}, Placement: req.Placement, Live: true}
			for range tc.tenantReads {
				if got, err := tenant.Get(ctx, imp); err != nil || got.Mark != req.Mark {
					t.Fatalf("tenant Get = %+v, %v; want the platform's VM, its mark reported", got, err)
				}
			}
			// The platform's Squid is silent from now on: only its kept
			// answer says it serves.
			mu.Lock()
			silent = true
			mu.Unlock()
			got, err := f.drv.Get(ctx, own)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.ProxyReachable); diff != "" {
				t.Errorf("%s\nplatform proxy ProxyReachable after the tenant's reads: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}
