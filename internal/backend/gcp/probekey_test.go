package gcp_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestAnotherConfigsInstanceOfTheSameNameLeavesTheProbeAlone: the
// drivers of every config share one readiness prober (Connector). A
// tenant's config whose project holds an instance of the same zone and
// name as a platform proxy (names are the tenant's to choose) must not
// take that proxy's place in it: the platform proxy's answer stays its
// own, and its Squid is not asked again for the tenant's every Get.
func TestAnotherConfigsInstanceOfTheSameNameLeavesTheProbeAlone(t *testing.T) {
	const name = "pt-shared-name"
	cases := map[string]struct {
		reason string
		// tenantGets are the Gets of the tenant's instance between two of
		// the platform's.
		tenantGets int
		want       bool
	}{
		"NoTenantGet": {
			reason: "The platform proxy's second Get answers from its own probe.",
			want:   true,
		},
		"TenantGetsBetween": {
			reason:     "The tenant's instance of the same name leaves the platform proxy's probe as it was.",
			tenantGets: 3,
			want:       true,
		},
	}
	for name2, tc := range cases {
		t.Run(name2, func(t *testing.T) {
			ctx := context.Background()
			var (
				mu      sync.Mutex
				current *gcptest.Server
				silent  bool
			)
			prober := &squid.Prober{Wait: time.Minute, PositiveTTL: time.Hour, NegativeTTL: time.Hour,
				Ask: func(ctx context.Context, addr string) (string, error) {
					mu.Lock()
					srv, off := current, silent
					mu.Unlock()
					if off {
						return "", errors.New("connection refused")
					}
					return srv.AskSquid(ctx, addr)
				}}
			shared := func(o *gcp.Options) { o.Prober = prober }
			platform := newFixture(t, shared)
			// The tenant's own project, with an instance of the same zone
			// and name as the platform's.
			tenant := &fixture{srv: gcptest.New(t, "team-a-project")}
			cfg := testConfig()
			cfg.Project = tenant.srv.Project
			tenant.driver = gcp.New(gcp.Options{Provider: "ProviderConfig team-a/gcp", Config: cfg, API: newSDK(t, tenant.srv), Prober: prober})
			use := func(s *gcptest.Server, off bool) {
				mu.Lock()
				current, silent = s, off
				mu.Unlock()
			}

			ref := func(f *fixture, uid string) proxy.Ref {
				req := request(name, uid)
				inst, err := f.driver.Create(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				f.srv.SettleAll()
				return refOf(inst, req)
			}
			pref := ref(platform, "0c8f6a1e-1111-4e2a-9c3f-0000000000p1")
			tref := ref(tenant, "0c8f6a1e-1111-4e2a-9c3f-0000000000t1")

			use(platform.srv, false)
			if got, err := observe(t, platform.driver, &pref); err != nil || !got.ProxyReachable {
				t.Fatalf("platform Get = %+v, %v; want its proxy answering", got, err)
			}
			use(tenant.srv, false)
			for range tc.tenantGets {
				if _, err := observe(t, tenant.driver, &tref); err != nil {
					t.Fatal(err)
				}
			}
			// The platform's Squid is silent from now on: only its kept
			// answer says it serves.
			use(platform.srv, true)
			got, err := observe(t, platform.driver, &pref)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.ProxyReachable); diff != "" {
				t.Errorf("%s\nplatform proxy ProxyReachable after the tenant's Gets: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}
