package kvm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestAnotherConfigsDomainOfTheSameNameLeavesTheProbeAlone: every kvm
// driver shares the Backend's readiness prober. A tenant's config whose
// host has the platform's host's name in the config (hosts are named by
// whoever writes the config) and a domain of the same name as a platform
// proxy must not take that proxy's place in it: the platform proxy's
// answer stays its own, and its Squid is not asked again for the
// tenant's every Get.
func TestAnotherConfigsDomainOfTheSameNameLeavesTheProbeAlone(t *testing.T) {
	const name = "shared-name"
	cases := map[string]struct {
		reason     string
		tenantGets int
		want       bool
	}{
		"NoTenantGet": {
			reason: "The platform proxy's second Get answers from its own probe.",
			want:   true,
		},
		"TenantGetsBetween": {
			reason:     "The tenant's domain of the same name leaves the platform proxy's probe as it was.",
			tenantGets: 3,
			want:       true,
		},
	}
	for tcName, tc := range cases {
		t.Run(tcName, func(t *testing.T) {
			ctx := context.Background()
			platform := newTestEnv(t)
			tenant := newTestEnv(t, func(e *testEnv) {
				e.cfg.Name = "ProviderConfig team-a/kvm"
				e.cfg.Hosts[0].Address = "fakehost2:22"
			})
			var (
				mu      sync.Mutex
				current *fakeHost
				silent  bool
			)
			prober := &squid.Prober{Wait: time.Minute, PositiveTTL: time.Hour, NegativeTTL: time.Hour,
				Ask: func(ctx context.Context, addr string) (string, error) {
					mu.Lock()
					h, off := current, silent
					mu.Unlock()
					if off {
						return "", errors.New("connection refused")
					}
					return h.squidAsk(ctx, addr)
				}}
			platform.b.prober, tenant.b.prober = prober, prober
			use := func(h *fakeHost, off bool) {
				mu.Lock()
				current, silent = h, off
				mu.Unlock()
			}

			pinst := platform.mustCreate(platform.request(name, "uid-platform"))
			if err := platform.settle(ctx, pinst.ID); err != nil {
				t.Fatal(err)
			}
			tinst := tenant.mustCreate(tenant.request(name, "uid-tenant"))
			if err := tenant.settle(ctx, tinst.ID); err != nil {
				t.Fatal(err)
			}

			use(platform.host, false)
			if got := platform.mustGet(ref(pinst)); !got.ProxyReachable {
				t.Fatalf("platform Get = %+v; want its proxy answering", got)
			}
			use(tenant.host, false)
			for range tc.tenantGets {
				tenant.mustGet(ref(tinst))
			}
			// The platform's Squid is silent from now on: only its kept
			// answer says it serves.
			use(platform.host, true)
			got := platform.mustGet(ref(pinst))
			if diff := cmp.Diff(tc.want, got.ProxyReachable); diff != "" {
				t.Errorf("%s\nplatform proxy ProxyReachable after the tenant's Gets: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}
