package kvm_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func TestMain(m *testing.M) {
	code := m.Run()
	kvmtest.Down()
	os.Exit(code)
}

// emptyImage serves a small empty qcow2 (no OS: the domain runs its
// firmware and finds nothing to boot, which is all these tests need) from
// loopback.
func emptyImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "empty.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", img, "256M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	return srv.URL + "/empty.qcow2"
}

// TestIntegrationLibvirt_lifecycle runs the driver against the real
// libvirtd (qemu:///system, TCG) through the real sshd: Check, a Create
// that downloads the image in the background, the resulting domain, volume
// and metadata on the host, an idempotent repeat, Delete leaving nothing
// but the shared base, for a BIOS and a UEFI (NVRAM) image.
func TestIntegrationLibvirt_lifecycle(t *testing.T) {
	h := kvmtest.Up(t)
	url := emptyImage(t)
	b := kvm.NewBackend(kvm.Options{})
	t.Cleanup(b.Close)
	d := b.Driver(kvm.Config{
		Name:              "ClusterProviderConfig integration",
		Credentials:       h.Credentials(),
		DiskSizeGB:        1,
		InstallGuestAgent: true,
		Images: map[string]kvm.Image{
			"empty":      {URL: url, Format: "qcow2", Firmware: "bios"},
			"empty-uefi": {URL: url, Format: "qcow2", Firmware: "uefi"},
		},
		MachineTypes: map[string]kvm.MachineType{"tiny": {VCPUs: 1, MemoryMiB: 256}},
		Hosts:        []kvm.Host{h.KVMHost("local")},
	})
	ctx := context.Background()
	before := h.Volumes(t)

	th := d.Check(ctx).Targets[0]
	if !th.Healthy || th.Details["libvirtVersion"] == "" || th.Details["poolState"] != "running" || th.Details["memoryAvailableMiB"] == "" || th.Details["memoryTotalMiB"] == "0" {
		t.Fatalf("Check = %+v", th)
	}
	t.Logf("Check: %v", th.Details)

	for _, image := range []string{"empty", "empty-uefi"} {
		t.Run(image, func(t *testing.T) {
			name := "egp-it-" + image
			req := proxy.Request{
				Name:      name,
				Mark:      proxy.Mark{UID: "0c8f6a1e-0000-4e2a-9c3f-" + strings.Repeat("0", 12-len(image)) + strings.ReplaceAll(image, "-", "0")[:min(len(image), 12)], InstallationID: "integration"},
				Placement: proxy.Placement{Location: "local", MachineType: "tiny", Image: image},
				Proxy:     proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"192.168.213.0/24"}, AllowedPorts: []int32{443}},
			}
			start := time.Now()
			inst, err := d.Create(ctx, req)
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			t.Logf("Create returned in %v: %s %q", time.Since(start), inst.State, inst.Progress)
			if inst.State != proxy.StateProvisioning {
				t.Errorf("Create: State %s", inst.State)
			}
			r := proxy.Ref{ID: inst.ID, Name: name, Mark: req.Mark, Placement: req.Placement}
			var got proxy.Instance
			deadline := time.Now().Add(2 * time.Minute)
			for time.Now().Before(deadline) {
				got, err = d.Get(ctx, r)
				if err != nil {
					t.Fatalf("Get: %v", err)
				}
				if strings.HasPrefix(got.Progress, "booting") {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Logf("domain running after %v: %s %q", time.Since(start), got.State, got.Progress)
			if got.State != proxy.StateProvisioning || got.Mark != req.Mark || !got.CreatedAt.Equal(inst.CreatedAt) {
				t.Errorf("Get = %+v", got)
			}
			if !slices.Contains(h.Domains(t), name) {
				t.Fatalf("no domain %s on the host", name)
			}
			x := h.Virsh(t, "dumpxml", name)
			for _, want := range []string{"<egressproxy:instance", "<uid>" + req.Mark.UID + "</uid>", "type='qemu'", name + ".qcow2", name + "-seed.iso"} {
				if !strings.Contains(x, want) {
					t.Errorf("domain XML lacks %q", want)
				}
			}
			if state := h.Virsh(t, "domstate", name); !strings.Contains(state, "running") {
				t.Errorf("domstate %q", state)
			}
			vols := h.Volumes(t)
			for _, v := range []string{name + ".qcow2", name + "-seed.iso"} {
				if !slices.Contains(vols, v) {
					t.Errorf("pool lacks %s: %v", v, vols)
				}
			}
			if again, err := d.Create(ctx, req); err != nil || again.ID != inst.ID {
				t.Errorf("repeat Create = %v, %v", again.ID, err)
			}
			l, err := d.List(ctx, "integration")
			i := slices.IndexFunc(l, func(i proxy.Instance) bool { return i.ID == inst.ID && i.Mark == req.Mark })
			if err != nil || i < 0 {
				t.Fatalf("List = %v, %v", l, err)
			}
			// The orphan sweep deletes with what List returns, no placement.
			listed := proxy.Ref{ID: l[i].ID, Name: l[i].Name, Mark: l[i].Mark, Live: true}
			// No guest agent in an empty disk: applying settings waits.
			changed := req
			changed.Proxy.Port = 8080
			if _, err := d.Update(ctx, r, changed); !proxy.IsTransient(err) {
				t.Errorf("Update without a guest agent = %v; want Transient", err)
			}

			start = time.Now()
			if err := d.Delete(ctx, listed); err != nil {
				t.Fatalf("Delete by what List returned: %v", err)
			}
			t.Logf("Delete took %v", time.Since(start))
			if _, err := d.Get(ctx, r); !proxy.IsNotFound(err) {
				t.Errorf("Get after Delete = %v; want NotFound", err)
			}
			if slices.Contains(h.Domains(t), name) {
				t.Errorf("domain %s left on the host", name)
			}
			for _, v := range h.Volumes(t) {
				if strings.HasPrefix(v, name) {
					t.Errorf("volume %s left in the pool", v)
				}
			}
			if image == "empty-uefi" {
				if out, _ := exec.Command("sh", "-c", "ls /var/lib/libvirt/qemu/nvram/ 2>/dev/null").Output(); strings.Contains(string(out), name) {
					t.Errorf("NVRAM of %s left: %s", name, out)
				}
			}
			if err := d.Delete(ctx, r); err != nil {
				t.Errorf("second Delete = %v", err)
			}
		})
	}
	// A create interrupted between define and start leaves a domain that
	// libvirt reports shut off with reason "unknown": Get reads it as
	// Provisioning and, for its own resource, starts it.
	t.Run("DefinedButNeverStarted", func(t *testing.T) {
		name := "egp-it-never-started"
		mark := proxy.Mark{UID: "0c8f6a1e-0000-4e2a-9c3f-00000000abcd", InstallationID: "integration"}
		x := `<domain type='qemu'><name>` + name + `</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>` +
			`<metadata><egressproxy:instance xmlns:egressproxy="https://egressproxy.io/kvm/v1alpha1"><managed>true</managed><uid>` + mark.UID +
			`</uid><installation>integration</installation><createdAt>2026-11-29T12:00:00Z</createdAt></egressproxy:instance></metadata>` +
			`<os><type arch='x86_64' machine='pc'>hvm</type></os></domain>`
		f := filepath.Join(t.TempDir(), "d.xml")
		if err := os.WriteFile(f, []byte(x), 0o600); err != nil {
			t.Fatal(err)
		}
		h.Virsh(t, "define", f)
		t.Cleanup(func() { _ = d.Delete(ctx, proxy.Ref{ID: "hosts/local/domains/" + name, Name: name, Mark: mark}) })
		if reason := h.Virsh(t, "domstate", "--reason", name); !strings.Contains(reason, "shut off (unknown)") {
			t.Fatalf("a defined domain's state is %q; the driver relies on 'shut off (unknown)'", reason)
		}
		r := proxy.Ref{ID: "hosts/local/domains/" + name, Name: name, Mark: mark}
		got, err := d.Get(ctx, r)
		if err != nil || got.State != proxy.StateProvisioning || got.Mark != mark {
			t.Fatalf("Get = %+v, %v", got, err)
		}
		if state := h.Virsh(t, "domstate", name); !strings.Contains(state, "running") {
			t.Errorf("Get did not start the domain: %q", state)
		}
		h.Virsh(t, "destroy", name)
		if got, err := d.Get(ctx, r); err != nil || got.State != proxy.StateStopped {
			t.Errorf("Get of a destroyed domain = %s, %v; want Stopped (and not started again)", got.State, err)
		}
	})

	// A create cut short before its domain was defined leaves the overlay
	// and the seed: the resource being deleted finds them (Ref.Deleting),
	// and Delete removes them from the real pool.
	t.Run("VolumesLeftWithoutADomain", func(t *testing.T) {
		name := "egp-it-cut-short"
		req := proxy.Request{
			Name:      name,
			Mark:      proxy.Mark{UID: "0c8f6a1e-0000-4e2a-9c3f-00000000cafe", InstallationID: "integration"},
			Placement: proxy.Placement{Location: "local", MachineType: "tiny", Image: "empty"},
			Proxy:     proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"192.168.213.0/24"}, AllowedPorts: []int32{443}},
		}
		inst, err := d.Create(ctx, req)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		// Once the image is in (when this subtest runs alone), the domain
		// runs.
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			got, err := d.Get(ctx, proxy.Ref{ID: inst.ID, Name: name, Mark: req.Mark, Placement: req.Placement})
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if strings.HasPrefix(got.Progress, "booting") {
				break
			}
		}
		// The domain goes by hand; its volumes stay, as a create stopped
		// between the seed and the define leaves them.
		h.Virsh(t, "destroy", name)
		h.Virsh(t, "undefine", name)
		vols := h.Volumes(t)
		for _, v := range []string{name + ".qcow2", name + "-seed.iso"} {
			if !slices.Contains(vols, v) {
				t.Fatalf("pool lacks %s before the deletion: %v", v, vols)
			}
		}
		r := proxy.Ref{Name: name, Mark: req.Mark, Placement: req.Placement, Live: true}
		if _, err := d.Get(ctx, r); !proxy.IsNotFound(err) {
			t.Errorf("Get of a live resource with only volumes = %v; want NotFound (Create resumes)", err)
		}
		r.Deleting = true
		got, err := d.Get(ctx, r)
		if err != nil || got.State != proxy.StateStopped || !strings.Contains(got.Progress, "remain in pool") {
			t.Fatalf("Get of the resource being deleted = %+v, %v; want Stopped naming the volumes", got, err)
		}
		if err := d.Delete(ctx, r); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := d.Get(ctx, r); !proxy.IsNotFound(err) {
			t.Errorf("Get after Delete = %v; want NotFound", err)
		}
		for _, v := range h.Volumes(t) {
			if strings.HasPrefix(v, name) {
				t.Errorf("volume %s left in the pool", v)
			}
		}
	})

	// What is left is the shared cache: a base and its marker per image
	// key (the URL is part of the name, and this test's URL is new each
	// run, so they are removed here to keep the pool from growing). The
	// pool is shared with other test binaries running now (another
	// package's bases, overlays and seeds): only this test's own names
	// are looked at and deleted.
	own := slices.Concat(kvm.BaseVolumes("empty", url, "", "qcow2", false), kvm.BaseVolumes("empty-uefi", url, "", "qcow2", false))
	have := h.Volumes(t)
	for _, v := range own {
		if !slices.Contains(have, v) {
			t.Errorf("volume %s is not in the pool; want a base and a marker per image key, kept for the next create", v)
		}
	}
	for _, v := range have {
		if !slices.Contains(before, v) && strings.Contains(v, "egp-it-") {
			t.Errorf("volume %s of this test's domains is left in the pool", v)
		}
	}
	h.DeleteVolumes(t, own...)
}
