package gcp_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestListReportsRulesAndAddressesWithoutInstance: the firewall rules and
// static addresses a bypassed deletion left behind, carrying this
// installation's mark, are listed (each name once, its pieces named), so
// the orphan sweep finds them; a retained address, another
// installation's, an unmarked rule and an unmarked address are not; the
// pieces of a listed instance are not listed apart from it.
func TestListReportsRulesAndAddressesWithoutInstance(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	d := f.newDriver()
	mark := func(uid, inst string) string {
		return "egress proxy, managed by provider-egressproxy: uid=" + uid + " installation=" + inst
	}
	labels := func(uid, inst, retain string) map[string]string {
		return map[string]string{gcp.LabelUID: uid, gcp.LabelInstallation: inst, gcp.LabelRetain: retain}
	}
	// Both pieces of a gone proxy; a rule alone of another.
	f.srv.PutFirewall(map[string]any{"name": "pt-gone", "description": mark("uid-gone", testInstallation)})
	f.srv.PutAddress("europe-west1", "pt-gone", labels("uid-gone", testInstallation, "false"))
	f.srv.PutFirewall(map[string]any{"name": "pt-rule-only", "description": mark("uid-rule", testInstallation)})
	// Not ours to report.
	f.srv.PutAddress("europe-west1", "pt-retained", labels("uid-kept", testInstallation, "true"))
	f.srv.PutFirewall(map[string]any{"name": "pt-theirs", "description": mark("uid-theirs", "another-installation")})
	f.srv.PutAddress("europe-west1", "pt-theirs", labels("uid-theirs", "another-installation", "false"))
	f.srv.PutFirewall(map[string]any{"name": "pt-hand", "description": "made by hand"})
	f.srv.PutAddress("europe-west1", "pt-hand", nil)
	// A live proxy's instance with its rule: the instance only.
	req := request("pt-live", "uid-live")
	req.Extension = gcp.Exposure{ManageFirewall: true}
	for range 5 {
		if _, err := d.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
		f.srv.SettleAll()
	}

	l, err := d.List(ctx, testInstallation)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]proxy.Instance{}
	for _, i := range l {
		if _, dup := got[i.Name]; dup {
			t.Errorf("List reports %q twice", i.Name)
		}
		got[i.Name] = i
	}
	var names []string
	for n := range got {
		names = append(names, n)
	}
	slices.Sort(names)
	if want := []string{"pt-gone", "pt-live", "pt-rule-only"}; !slices.Equal(names, want) {
		t.Fatalf("List = %v; want %v", names, want)
	}
	if live := got["pt-live"]; len(live.Leftovers) > 0 {
		t.Errorf("the live instance is reported with leftovers %v", live.Leftovers)
	}
	gone := got["pt-gone"]
	if gone.Mark != (proxy.Mark{UID: "uid-gone", InstallationID: testInstallation}) || len(gone.Leftovers) != 2 ||
		!strings.HasPrefix(gone.ID, "zones/europe-west1-") || gone.CreatedAt.IsZero() {
		t.Errorf("the gone proxy's pieces = %+v; want its mark, an ID in the address's region, a creation time and both pieces", gone)
	}
	if r := got["pt-rule-only"]; len(r.Leftovers) != 1 || !strings.HasPrefix(r.Leftovers[0], "firewall rule") {
		t.Errorf("the lone rule = %+v; want one firewall rule", r)
	}

	// A Delete by what List returned removes the pieces, one step a call,
	// and nothing else.
	for range 5 {
		if err := d.Delete(ctx, proxy.Ref{ID: gone.ID, Name: gone.Name, Mark: gone.Mark, Live: true}); err != nil {
			t.Fatal(err)
		}
		f.srv.SettleAll()
	}
	if _, ok := f.srv.Firewall("pt-gone"); ok {
		t.Error("the gone proxy's rule is still there")
	}
	if _, ok := f.srv.Address("europe-west1", "pt-gone"); ok {
		t.Error("the gone proxy's address is still there")
	}
	for _, keep := range []string{"pt-theirs", "pt-hand"} {
		if _, ok := f.srv.Firewall(keep); !ok {
			t.Errorf("rule %s was removed", keep)
		}
	}
	if v := f.srv.Violations(); len(v) > 0 {
		t.Errorf("requests the real API would refuse: %v", v)
	}
}
