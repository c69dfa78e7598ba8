package kvm

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// volSnapshot is what must not change about a volume.
func (e *testEnv) volSnapshot(name string) (fakeVol, bool) {
	e.host.mu.Lock()
	defer e.host.mu.Unlock()
	v, ok := e.host.pools["default"].vols[name]
	if !ok {
		return fakeVol{}, false
	}
	c := *v
	c.content = bytes.Clone(v.content)
	return c, true
}

func (e *testEnv) sameVolume(where, name string, before fakeVol) {
	e.t.Helper()
	after, ok := e.volSnapshot(name)
	switch {
	case !ok:
		e.t.Errorf("%s: volume %s was deleted", where, name)
	case after.format != before.format || after.capacity != before.capacity || after.backing != before.backing || !bytes.Equal(after.content, before.content):
		e.t.Errorf("%s: volume %s changed", where, name)
	}
}

// addDomainWithDisk defines a domain by hand with the disk element given.
func (e *testEnv) addDomainWithDisk(name, disk string) {
	e.host.mu.Lock()
	defer e.host.mu.Unlock()
	e.host.domains[name] = &fakeDomain{name: name, state: libvirt.DomainRunning, meta: map[string]string{},
		xml: "<domain type='kvm'><name>" + name + "</name><devices>" + disk + "</devices></domain>"}
}

// TestTakeover_externalNameOfTheBaseImage: the attack that deleted the
// shared base image every proxy backs onto. The name is refused before any
// call, and the base stays.
func TestTakeover_externalNameOfTheBaseImage(t *testing.T) {
	e := newTestEnv(t)
	warm(t, e)
	base := imageOf(e).volume()
	before, _ := e.volSnapshot(base)
	name := strings.TrimSuffix(base, ".qcow2")
	req := e.request(name, "uid-attacker")
	if _, err := e.d.Create(context.Background(), req); !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "base images") {
		t.Fatalf("Create named after the base image = %v; want Permanent saying it names the base images", err)
	}
	r := proxy.Ref{Name: name, Mark: req.Mark, Placement: req.Placement, Live: true}
	_ = e.d.Delete(context.Background(), r)
	e.sameVolume("after Create and Delete", base, before)
	createAndBoot(t, e, "web", "uid-1") // the base still serves
}

// TestTakeover_diskOfAnotherDomain: an instance whose overlay or seed
// would be another domain's disk is refused, and neither Create nor
// Delete touches the disk, however the domain names it: by path (quoted
// either way, with XML escapes), as a block device, or by pool and volume.
func TestTakeover_diskOfAnotherDomain(t *testing.T) {
	disks := map[string]func(vol string) string{
		"File": func(vol string) string {
			return "<disk type='file' device='disk'><source file='/var/lib/libvirt/images/" + vol + "'/></disk>"
		},
		"FileEscaped": func(vol string) string {
			return `<disk type="file" device="disk"><source file="/var/lib/libvirt/images/` + strings.ReplaceAll(vol, ".", "&#46;") + `"/></disk>`
		},
		"Block": func(vol string) string {
			return "<disk type='block' device='disk'><source dev='/var/lib/libvirt/images/" + vol + "'/></disk>"
		},
		"Volume": func(vol string) string {
			return "<disk type='volume' device='disk'><source pool='default' volume='" + vol + "'/></disk>"
		},
	}
	for form, disk := range disks {
		for _, vol := range []string{"db.qcow2", "db-seed.iso"} {
			t.Run(form+"/"+vol, func(t *testing.T) {
				diskOfAnotherDomain(t, vol, disk(vol))
			})
		}
	}
}

func diskOfAnotherDomain(t *testing.T, vol, diskXML string) {
	{
		{
			e := newTestEnv(t)
			warm(t, e)
			base := imageOf(e).volume()
			e.host.mu.Lock()
			disk := &fakeVol{name: vol, format: "qcow2", capacity: 10 << 30, backing: "/var/lib/libvirt/images/" + base, content: []byte("the database")}
			if strings.HasSuffix(vol, ".iso") {
				disk = &fakeVol{name: vol, format: "raw", capacity: 64 << 10, content: bytes.Repeat([]byte{1}, 64<<10)}
			}
			e.host.pools["default"].vols[vol] = disk
			e.host.mu.Unlock()
			e.addDomainWithDisk("production-db", diskXML)
			before, _ := e.volSnapshot(vol)

			req := e.request("db", "uid-attacker")
			err := e.reconcileSettled(req)
			if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "is a disk of domain production-db") {
				t.Errorf("Create of db = %v; want Permanent naming the domain whose disk it is", err)
			}
			if err := e.d.Delete(context.Background(), proxy.Ref{Name: "db", Mark: req.Mark, Placement: req.Placement, Live: true}); err != nil {
				t.Errorf("Delete of the refused db = %v; want nil", err)
			}
			e.sameVolume("after Create and Delete", vol, before)
		}
	}
}

// TestTakeover_volumeTheProviderDidNotCreate: a volume of the overlay's or
// the seed's name that no domain uses but that is not of the provider's
// making (a raw disk, someone's ISO) is neither replaced nor deleted.
func TestTakeover_volumeTheProviderDidNotCreate(t *testing.T) {
	for _, vol := range []string{"notes.qcow2", "notes-seed.iso"} {
		t.Run(vol, func(t *testing.T) {
			e := newTestEnv(t)
			warm(t, e)
			e.host.mu.Lock()
			e.host.pools["default"].vols[vol] = &fakeVol{name: vol, format: "raw", capacity: 64 << 10, content: bytes.Repeat([]byte("kept"), 16<<10)}
			e.host.mu.Unlock()
			before, _ := e.volSnapshot(vol)
			req := e.request("notes", "uid-attacker")
			err := e.reconcileSettled(req)
			if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "volume "+vol) {
				t.Errorf("Create of notes = %v; want Permanent naming volume %s", err, vol)
			}
			if err := e.d.Delete(context.Background(), proxy.Ref{Name: "notes", Mark: req.Mark, Placement: req.Placement, Live: true}); err != nil {
				t.Errorf("Delete of the refused notes = %v; want nil", err)
			}
			e.sameVolume("after Create and Delete", vol, before)
		})
	}
}
