package gcp_test

import (
	"context"
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
	ctx := context.Background()
	t.Run("FirewallRule", func(t *testing.T) {
		f := newFixture(t)
		f.srv.PutFirewall(map[string]any{"name": "allow-admin", "network": "global/networks/default",
			"sourceRanges": []any{"203.0.113.0/24"}, "targetTags": []any{"bastion"},
			"allowed": []any{map[string]any{"IPProtocol": "tcp", "ports": []any{"22"}}}})
		before, _ := f.srv.Firewall("allow-admin")
		req := request("allow-admin", "0c8f6a1e-2222-4e2a-9c3f-00000000000a")
		req.Extension = gcp.Exposure{ManageFirewall: true}
		_, err := f.driver.Create(ctx, req)
		if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), `firewall rule "allow-admin" already exists and is not this proxy's`) {
			t.Fatalf("Create over a human's firewall rule = %v; want Permanent naming the rule", err)
		}
		if _, ok := f.srv.Instance(testZone, req.Name); ok {
			t.Errorf("the refused Create inserted an instance")
		}
		if err := f.driver.Delete(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement, Live: true}); err != nil {
			t.Errorf("Delete after the refused Create = %v; want nil", err)
		}
		f.srv.SettleAll()
		if after, ok := f.srv.Firewall("allow-admin"); !ok || fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("the human's firewall rule changed:\nbefore %v\nafter  %v (exists %v)", before, after, ok)
		}
	})
	t.Run("StaticAddressOfAnotherResource", func(t *testing.T) {
		f := newFixture(t)
		other := proxy.Mark{UID: "0c8f6a1e-3333-4e2a-9c3f-00000000000b", InstallationID: testInstallation}
		f.srv.PutAddress(testRegion, "team-b-egress", map[string]string{"egressproxy-uid": other.UID, "egressproxy-installation": other.InstallationID})
		before, _ := f.srv.Address(testRegion, "team-b-egress")
		req := request("team-b-egress", "0c8f6a1e-2222-4e2a-9c3f-00000000000a")
		req.Extension = gcp.Exposure{AddressType: gcp.AddressStatic}
		_, err := f.driver.Create(ctx, req)
		if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), `address "team-b-egress" already exists`) {
			t.Fatalf("Create over another resource's address = %v; want Permanent naming the address", err)
		}
		if _, ok := f.srv.Instance(testZone, req.Name); ok {
			t.Errorf("the refused Create inserted an instance")
		}
		if err := f.driver.Delete(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement, Live: true}); err != nil {
			t.Errorf("Delete after the refused Create = %v; want nil", err)
		}
		f.srv.SettleAll()
		if after, ok := f.srv.Address(testRegion, "team-b-egress"); !ok || fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("the other resource's address changed:\nbefore %v\nafter  %v (exists %v)", before, after, ok)
		}
	})
}
