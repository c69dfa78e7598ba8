package proxmox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestTakeover_theTemplateIsNeverTouched: refs naming the template every
// proxy is cloned from (its VMID and name as an ID, or its name as an
// external name) never change or destroy it.
func TestTakeover_theTemplateIsNeverTouched(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var name string
	var before string
	for _, v := range f.fake.VMs() {
		if v.VMID == 9000 {
			name, before = v.Config["name"], fmt.Sprint(v.Config)
		}
	}
	if name == "" {
		t.Fatal("the fixture has no template 9000")
	}
	req := f.request(name, "0c8f6a1e-4444-4e2a-9c3f-00000000000a")
	for _, r := range []proxy.Ref{
		{ID: fmt.Sprintf("vms/9000/%s", name), Name: name, Mark: req.Mark, Placement: req.Placement},
		{Name: name, Mark: req.Mark, Placement: req.Placement, Live: true},
	} {
		if _, err := f.drv.Update(ctx, r, req); err == nil {
			t.Errorf("Update(%+v) of the template succeeded", r)
		}
		if err := f.drv.Delete(ctx, r); err != nil && !proxy.IsPermanent(err) {
			t.Errorf("Delete(%+v) = %v; want nil or Permanent", r, err)
		}
		f.fake.FinishTasks()
	}
	for _, v := range f.fake.VMs() {
		if v.VMID == 9000 {
			if after := fmt.Sprint(v.Config); after != before {
				t.Errorf("the template changed:\nbefore %s\nafter  %s", before, after)
			}
			return
		}
	}
	t.Error("the template was destroyed")
}
