package proxmox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestRestartDuringCloneMakesNoSecondVM: a provider that restarts (and
// lost the status) while its clone runs finds the nameless, locked entry
// in the resource's probe window, reports it as Provisioning and waits;
// it never clones a second time.
func TestRestartDuringCloneMakesNoSecondVM(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	req := f.request("pt-restart", "0e1f2a3b-5555-4a5e-9d55-0a9c1f1e2b3c")
	first, err := f.drv.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if vm := f.fake.VMs(); !vm[len(vm)-1].Cloning || vm[len(vm)-1].Name != "" {
		t.Fatalf("the clone's entry: %+v; want nameless and cloning", vm[len(vm)-1])
	}
	restarted := f.newDriver()
	got, err := restarted.Get(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement})
	if err != nil || got.ID != first.ID || got.State != proxy.StateProvisioning || got.Mark != req.Mark {
		t.Errorf("Get after a restart during the clone = %+v, %v; want %s Provisioning, marked as the asker's", got, err, first.ID)
	}
	if _, err := restarted.Create(ctx, req); !proxy.IsTransient(err) || !strings.Contains(err.Error(), "being cloned") {
		t.Errorf("Create after a restart during the clone = %v; want Transient, waiting for the clone", err)
	}
	clones := 0
	for _, r := range f.fake.Requests() {
		if strings.HasSuffix(r.Endpoint, "/clone") {
			clones++
		}
	}
	if clones != 1 {
		t.Errorf("%d clone requests; want 1", clones)
	}
	f.fake.FinishTasks()
	r := &reconciler{t: t, f: f, drv: restarted, req: req}
	r.converge(ctx, 20)
	if r.status.ID != first.ID {
		t.Errorf("ready as %s; want %s", r.status.ID, first.ID)
	}
}

// TestTemplateRefusedBeforeAnyClone: a template whose clones could not be
// proxies is refused, Permanent, without a clone.
func TestTemplateRefusedBeforeAnyClone(t *testing.T) {
	cases := map[string]struct {
		tmpl pvetest.Template
		cfg  func(*proxmox.Config)
		want string
	}{
		"cloud-init drive": {tmpl: pvetest.Template{VMID: 9000, Node: "pve1", Config: map[string]string{"ide0": "local-lvm:vm-9000-cloudinit,media=cdrom"}}, want: "cloud-init drive"},
		"not a template":   {tmpl: pvetest.Template{VMID: 9000, Node: "pve1", NotTemplate: true}, want: "is not a template"},
		"missing":          {tmpl: pvetest.Template{VMID: 9001, Node: "pve1"}, want: "does not exist"},
		"no network": {tmpl: pvetest.Template{VMID: 9000, Node: "pve1", Config: map[string]string{"net0": ""}},
			cfg: func(c *proxmox.Config) { c.Bridge, c.VLANTag = "", 0 }, want: "no net0"},
		"unsized disk": {tmpl: pvetest.Template{VMID: 9000, Node: "pve1", Config: map[string]string{"scsi0": "local-lvm:base-9000-disk-0"}}, want: "no boot disk with a size"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			opts := []fixtureOption{withFake(func(o *pvetest.Options) { o.Templates = []pvetest.Template{c.tmpl} })}
			if c.cfg != nil {
				opts = append(opts, withConfig(c.cfg))
			}
			f := newFixture(t, opts...)
			req := f.request("pt-template", "1f2a3b4c-6666-4a5e-9d55-0a9c1f1e2b3c")
			_, err := f.drv.Create(context.Background(), req)
			if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Create = %v; want Permanent saying %q", err, c.want)
			}
			for _, r := range f.fake.Requests() {
				if r.Method != "GET" {
					t.Errorf("a refused template still led to %s %s", r.Method, r.Path)
				}
			}
		})
	}
}

// TestCloneToAnotherNodeNeedsSharedStorage: a template on node-local
// storage cannot be cloned to another node; the API's refusal is
// Permanent and says why.
func TestCloneToAnotherNodeNeedsSharedStorage(t *testing.T) {
	f := newFixture(t)
	req := f.request("pt-target", "2a3b4c5d-7777-4a5e-9d55-0a9c1f1e2b3c")
	req.Placement.Location = "pve2"
	_, err := f.drv.Create(context.Background(), req)
	if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "VM uses local storage") {
		t.Errorf("Create on pve2 = %v; want Permanent: local storage", err)
	}
	shared := newFixture(t, withFake(func(o *pvetest.Options) {
		o.Templates = []pvetest.Template{{VMID: 9000, Node: "pve1", Config: map[string]string{"scsi0": "shared-iso:9000/base-9000-disk-0.qcow2,size=3G"}}}
	}))
	r := &reconciler{t: t, f: shared, drv: shared.drv, req: req}
	r.converge(context.Background(), 20)
	if vm := vmNamed(t, shared.fake, req.Name); vm.Node != "pve2" {
		t.Errorf("VM on %s; want pve2", vm.Node)
	}
}

// TestRenamedVMIsNeverDuplicated: a VM carrying the resource's mark under
// another name (renamed by hand) in its probe window makes Create refuse,
// rather than clone a second VM.
func TestRenamedVMIsNeverDuplicated(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	req := f.request("pt-renamed", "3b4c5d6e-8888-4a5e-9d55-0a9c1f1e2b3c")
	r := &reconciler{t: t, f: f, drv: f.drv, req: req}
	r.converge(ctx, 20)
	vm := vmNamed(t, f.fake, req.Name)
	if err := f.fake.Rename(vm.VMID, "renamed-by-hand"); err != nil {
		t.Fatal(err)
	}
	_, err := f.drv.Create(ctx, req)
	if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "rename it back") {
		t.Errorf("Create with the VM renamed = %v; want Permanent, naming the VM", err)
	}
}

// TestContainersTakeVMIDs: an LXC container's VMID is taken for VMs too;
// allocation skips it, and a window full of guests is Quota.
func TestContainersTakeVMIDs(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, withConfig(func(c *proxmox.Config) { c.VMIDMin, c.VMIDMax = 100000, 100001 }))
	f.fake.AddContainer(100000, "pve1", "dns")
	inst, err := f.drv.Create(ctx, f.request("pt-ct", "4d5e6f70-9999-4a5e-9d55-0a9c1f1e2b3c"))
	if err != nil || vmidOf(t, inst.ID) != 100001 {
		t.Fatalf("Create = %+v, %v; want VMID 100001", inst, err)
	}
	_, err = f.drv.Create(ctx, f.request("pt-ct2", "4d5e6f70-aaaa-4a5e-9d55-0a9c1f1e2b3c"))
	wantErr(t, "Create with no VMID left", err, proxy.ClassQuota, "no free VMID")
}
