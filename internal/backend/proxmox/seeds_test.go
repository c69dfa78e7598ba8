package proxmox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestListReportsSeedsWithoutVM: the seed ISO of a VM removed by hand
// (its resource's deletion bypassed) is listed as leftovers, with the UID
// prefix its name carries and no mark (the name carries no
// installation): the sweep reports it, never deletes it. A seed whose VM
// stands is not listed apart from the VM; an unreadable node does not
// fail the listing.
func TestListReportsSeedsWithoutVM(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	up := func(name, uid string) *reconciler {
		r := &reconciler{t: t, f: f, drv: f.drv, req: f.request(name, uid)}
		for range 10 {
			if _, err := r.reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			f.fake.FinishTasks()
		}
		return r
	}
	gone := up("pt-gone", "0c8f6a1e-5b7d-4e2a-9c3f-00000000000a")
	up("pt-live", "0c8f6a1e-5b7d-4e2a-9c3f-00000000000b")
	f.fake.Remove(vmidOf(t, gone.status.ID))

	l, err := f.drv.List(ctx, testInstallation)
	if err != nil {
		t.Fatal(err)
	}
	var seeds []proxy.Instance
	for _, i := range l {
		if len(i.Leftovers) > 0 {
			seeds = append(seeds, i)
		}
	}
	if len(seeds) != 1 {
		t.Fatalf("List reports leftovers %+v; want the seed of pt-gone alone", seeds)
	}
	s := seeds[0]
	if s.Name != "pt-gone" || s.Mark != (proxy.Mark{}) || s.Details[proxy.DetailUIDPrefix] != "0c8f6a1e5b7d" ||
		!strings.Contains(s.Leftovers[0], "egressproxy-pt-gone-0c8f6a1e5b7d.iso") || s.CreatedAt.IsZero() {
		t.Errorf("the seed of pt-gone = %+v; want its name, no mark, the UID prefix, the file and a creation time", s)
	}

	f.fake.SetNodeOnline("pve2", false)
	if _, err := f.drv.List(ctx, testInstallation); err != nil {
		t.Errorf("List with a node offline = %v; want the rest listed", err)
	}
}
