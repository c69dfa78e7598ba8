package external

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestATenantsGuestIsCheckedThroughTheTenantGuard: a namespaced proxy on
// a ClusterProviderConfig whose guest runs the tenant's own cloud-init or
// image (on a backend that takes the address from the guest) reports the
// cluster's kubernetes Service as its proxy's address. The request and
// the Ref say TenantGuest, and the egress check does not connect there:
// its condition says the address is refused and quotes nothing it would
// answer. The platform's own guests, a backend whose addresses are not
// the guest's word (GCP) and a cluster-scoped resource are checked as the
// platform's.
func TestATenantsGuestIsCheckedThroughTheTenantGuard(t *testing.T) {
	tenantGuard := netguard.New(netguard.Options{Denied: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}})
	const cloudInit = "#cloud-config\nruncmd: [true]\n"
	for name, tc := range map[string]struct {
		guestReports bool
		tenant       bool
		namespaced   bool
		cloudInit    string
		image        string
		want         bool
	}{
		"tenant's cloud-init":                    {guestReports: true, tenant: true, cloudInit: cloudInit, want: true},
		"tenant's image by URL":                  {guestReports: true, tenant: true, image: "https://tenant.example/i.qcow2", want: true},
		"namespaced config":                      {guestReports: true, namespaced: true, want: true},
		"tenant on the platform's guest":         {guestReports: true, tenant: true},
		"address not the guest's word":           {tenant: true, cloudInit: cloudInit},
		"cluster-scoped resource's cloudInit":    {guestReports: true, cloudInit: cloudInit},
		"cluster-scoped resource's image by URL": {guestReports: true, image: "https://images.example/i.qcow2", want: true},
	} {
		t.Run(name, func(t *testing.T) {
			k := testKind(nil)
			k.Request = func(_ *Config, p *spec.KVMProxyParameters, req *proxy.Request) error {
				req.Placement = proxy.Placement{Location: "local", MachineType: "small", Image: "squid"}
				if p.Image != "" {
					req.Placement.Image = p.Image
				}
				req.CloudInit = p.CloudInit
				return nil
			}
			k.Backend.Block = func(s *spec.ProviderConfigSpec) (Block, bool) {
				return Block{EgressCheck: &spec.EgressCheck{URL: testEchoURL}, AllowTenantCloudInit: true,
					ImagesByURL: &ImagesByURL{Allowed: true, TenantAllowed: true}, GuestReportsAddress: tc.guestReports}, s.KVM != nil
			}
			e := newExternal(k, nil, nil)
			e.cfg.Backend, e.cfg.Tenant, e.cfg.Namespaced, e.cfg.TenantGuard = &k.Backend, tc.tenant, tc.namespaced, tenantGuard
			if tc.namespaced {
				e.cfg.Guard = tenantGuard
			}
			var mu sync.Mutex
			var asked []string
			e.egress = &squid.EgressChecker{Ask: func(_ context.Context, addr string, _ proxy.EgressCheck) (string, error) {
				mu.Lock()
				asked = append(asked, addr)
				mu.Unlock()
				return "203.0.113.7", nil
			}}
			cr := proxyResource(func(cr *nsproxy.KVMProxy) {
				cr.Spec.ForProvider.CloudInit, cr.Spec.ForProvider.Image = tc.cloudInit, tc.image
			})
			req, err := e.request(context.Background(), cr)
			if err != nil {
				t.Fatal(err)
			}
			if got := ref(cr, req, cr.Observation()).TenantGuest; req.TenantGuest != tc.want || got != tc.want {
				t.Errorf("TenantGuest: request %v, Ref %v; want %v", req.TenantGuest, got, tc.want)
			}
			inst := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.96.0.1", ProxyReachable: true, ProxyAddress: "10.96.0.1:3128"}
			before := egressOf(cr.Observation())
			setObservation(cr.Observation(), inst, req, nil)
			e.setEgress(context.Background(), cr, &inst, req, before)
			c := cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
			mu.Lock()
			n := len(asked)
			mu.Unlock()
			if !tc.want {
				if n == 0 || c.Reason != reasonEgressVerified {
					t.Errorf("the platform's guest: asked %d times, EgressVerified %s %q; want checked and verified", n, c.Reason, c.Message)
				}
				return
			}
			if n != 0 || c.Reason != reasonEgressFailed || !strings.Contains(c.Message, "does not connect to 10.96.0.1 for tenants") || strings.Contains(c.Message, "203.0.113.7") {
				t.Errorf("a tenant's guest reporting 10.96.0.1:3128: asked %v, EgressVerified %s %q; want no check and a refusal", asked, c.Reason, c.Message)
			}
			// The refusal holds for the platform's config too: it must not
			// give a namespaced config as its reason.
			if !tc.namespaced && strings.Contains(c.Message, "namespaced") {
				t.Errorf("a tenant's guest on a ClusterProviderConfig: EgressVerified %q names a namespaced config", c.Message)
			}
		})
	}
}
