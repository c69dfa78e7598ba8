package gcp_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestTakeover_firewallRuleAndAddressOfTheName: an external name that
// names a firewall rule or a static address the provider did not make for
// this proxy (a human's allow-all rule, another team's address) fails
// Create, and neither Create nor Delete changes or removes it.
func TestTakeover_firewallRuleAndAddressOfTheName(t *testing.T) {
	for _, tc := range []struct {
		name, object string
		// put makes the object of the name; read reads it back.
		put      func(f *fixture)
		read     func(f *fixture) (map[string]any, bool)
		exposure gcp.Exposure
		wantErr  string
		refused  string // what the Create was refused over, for messages
	}{
		{
			name: "FirewallRule", object: "allow-admin",
			put: func(f *fixture) {
				f.srv.PutFirewall(map[string]any{"name": "allow-admin", "network": "global/networks/default",
					"sourceRanges": []any{"203.0.113.0/24"}, "targetTags": []any{"bastion"},
					"allowed": []any{map[string]any{"IPProtocol": "tcp", "ports": []any{"22"}}}})
			},
			read:     func(f *fixture) (map[string]any, bool) { return f.srv.Firewall("allow-admin") },
			exposure: gcp.Exposure{ManageFirewall: true},
			wantErr:  `firewall rule "allow-admin" already exists and is not this proxy's`,
			refused:  "a human's firewall rule",
		},
		{
			name: "StaticAddressOfAnotherResource", object: "team-b-egress",
			put: func(f *fixture) {
				other := proxy.Mark{UID: "0c8f6a1e-3333-4e2a-9c3f-00000000000b", InstallationID: testInstallation}
				f.srv.PutAddress(testRegion, "team-b-egress", map[string]string{"egressproxy-uid": other.UID, "egressproxy-installation": other.InstallationID})
			},
			read:     func(f *fixture) (map[string]any, bool) { return f.srv.Address(testRegion, "team-b-egress") },
			exposure: gcp.Exposure{AddressType: gcp.AddressStatic},
			wantErr:  `address "team-b-egress" already exists`,
			refused:  "another resource's address",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			f := newFixture(t)
			tc.put(f)
			before, _ := tc.read(f)
			req := request(tc.object, "0c8f6a1e-2222-4e2a-9c3f-00000000000a")
			req.Extension = tc.exposure
			_, err := f.driver.Create(ctx, req)
			if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Create over %s = %v; want Permanent naming it", tc.refused, err)
			}
			if _, ok := f.srv.Instance(testZone, req.Name); ok {
				t.Errorf("the refused Create inserted an instance")
			}
			if err := f.driver.Delete(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement, Live: true}); err != nil {
				t.Errorf("Delete after the refused Create = %v; want nil", err)
			}
			f.srv.SettleAll()
			if after, ok := tc.read(f); !ok || fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("%s changed:\nbefore %v\nafter  %v (exists %v)", tc.refused, before, after, ok)
			}
		})
	}
}
