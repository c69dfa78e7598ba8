package proxmox_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestDeleteFindsTheSeedWhereItLives: the seed ISO is deleted from the node
// it was uploaded to, also after the VM migrated to another node (on
// node-local storage the file stays behind), and from wherever it is when
// the VM was removed by hand.
func TestDeleteFindsTheSeedWhereItLives(t *testing.T) {
	ctx := context.Background()
	t.Run("after a migration", func(t *testing.T) {
		f := newFixture(t)
		r := ready(t, f, "pt-migrated", "80910213-0001-4a5e-9d55-0a9c1f1e2b3c")
		if v := f.fake.Volumes(); len(v) != 1 || v[0].Node != "pve1" {
			t.Fatalf("seed: %+v; want one on pve1", v)
		}
		if err := f.fake.Migrate(vmidOf(t, r.status.ID), "pve2"); err != nil {
			t.Fatal(err)
		}
		r.deleteAll(ctx, 20)
	})
	t.Run("VM removed by hand", func(t *testing.T) {
		f := newFixture(t)
		r := ready(t, f, "pt-removed", "80910213-0002-4a5e-9d55-0a9c1f1e2b3c")
		f.fake.Remove(vmidOf(t, r.status.ID))
		// As the controller deletes it: Get finds no VM but the seed, and
		// reports it, so that Delete runs and removes it.
		r.deleted = true
		got, err := f.drv.Get(ctx, r.ref())
		if err != nil || got.State != proxy.StateStopped || !strings.Contains(got.Progress, "seed ISO") || got.Mark != r.req.Mark {
			t.Fatalf("Get of the deleted resource with only its seed left = %+v, %v; want Stopped naming the seed", got, err)
		}
		r.converge(ctx, 20)
		assertNothingLeft(t, f.fake)
	})
	t.Run("shared ISO storage", func(t *testing.T) {
		f := newFixture(t, withConfig(func(c *proxmox.Config) { c.ISOStorage = "shared-iso" }))
		r := ready(t, f, "pt-shared", "80910213-0003-4a5e-9d55-0a9c1f1e2b3c")
		if v := f.fake.Volumes(); len(v) != 1 || v[0].Node != "" {
			t.Fatalf("seed: %+v; want one on the shared storage", v)
		}
		r.deleteAll(ctx, 20)
	})
}

// TestDeleteLeavesOthersAlone: a VM with the resource's name that is not
// the resource's (no mark, or another UID) is never stopped or destroyed.
func TestDeleteLeavesOthersAlone(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	other := ready(t, f, "pt-other", "80910213-0004-4a5e-9d55-0a9c1f1e2b3c")
	ref := other.ref()
	ref.ID = ""
	ref.Mark.UID = "80910213-9999-4a5e-9d55-0a9c1f1e2b3c"
	if err := f.drv.Delete(ctx, ref); err != nil {
		t.Fatal(err)
	}
	f.fake.FinishTasks()
	if vm := vmNamed(t, f.fake, "pt-other"); vm.Status != "running" {
		t.Errorf("another resource's VM is %s after Delete; want untouched", vm.Status)
	}
	inst, err := f.drv.Get(ctx, other.ref())
	if err != nil || inst.State != proxy.StateRunning {
		t.Errorf("Get = %+v, %v; want still Running", inst, err)
	}
}

// TestDeleteLeavesISOsItsRecordNames: the seed record in a VM's
// description can be edited by whoever may configure the VM. A record
// naming another ISO of the storage does not make the deletion delete
// that ISO; the resource's own seed still goes.
func TestDeleteLeavesISOsItsRecordNames(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	r := ready(t, f, "pt-edited", "80910213-0005-4a5e-9d55-0a9c1f1e2b3c")
	client, err := proxmox.NewClient(f.fake.URL, f.credentials, false, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Upload(ctx, "pve1", "local", "installer.iso", []byte("an ISO of the admin's")); err != nil {
		t.Fatal(err)
	}
	vm := vmNamed(t, f.fake, "pt-edited")
	cfg, err := client.VMConfig(ctx, vm.Node, vm.VMID)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(cfg["description"], "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "egressproxy-seed: ") {
			lines[i] = "egressproxy-seed: pve1 local:iso/installer.iso"
		}
	}
	if err := client.SetVMConfig(ctx, vm.Node, vm.VMID, proxmox.ConfigUpdate{Set: map[string]string{"description": strings.Join(lines, "\n")}}); err != nil {
		t.Fatal(err)
	}

	r.deleted = true
	r.converge(ctx, 20)
	vols := f.fake.Volumes()
	if len(vols) != 1 || vols[0].VolID != "local:iso/installer.iso" {
		t.Errorf("volumes after the deletion: %+v; want only local:iso/installer.iso", vols)
	}
	if got := f.fake.VMs(); slices.ContainsFunc(got, func(vm pvetest.VM) bool { return !vm.Template() }) {
		t.Errorf("VMs after the deletion: %+v; want only the template", got)
	}
}
