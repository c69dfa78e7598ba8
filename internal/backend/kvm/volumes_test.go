package kvm

import (
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestTakeover_leftoversOfAnotherResource: a domain removed by hand leaves
// its overlay and its seed, which carries its resource's mark. A resource
// of another UID (an external name), or of another installation (two
// control planes on one host), naming the same instance finds nothing of
// its own when deleted, and its Create is refused: it neither reuses the
// overlay nor replaces the seed. The owner's Create takes them up again.
func TestTakeover_leftoversOfAnotherResource(t *testing.T) {
	for what, mark := range map[string]proxy.Mark{
		"anotherUID":          {UID: "uid-other", InstallationID: testInstallation},
		"anotherInstallation": {UID: "uid-owner", InstallationID: "other-install"},
	} {
		t.Run(what, func(t *testing.T) {
			e := newTestEnv(t)
			createAndBoot(t, e, "db", "uid-owner")
			e.host.mu.Lock()
			e.host.pools["default"].vols["db.qcow2"].content = []byte("the owner's disk")
			delete(e.host.domains, "db") // virsh undefine
			e.host.mu.Unlock()
			overlay, _ := e.volSnapshot("db.qcow2")
			seed, _ := e.volSnapshot("db-seed.iso")

			req := e.request("db", mark.UID)
			req.Mark = mark
			if first := e.deleteAsTheController(proxy.Ref{Name: "db", Mark: mark, Placement: req.Placement}); first.ID != "" {
				t.Errorf("Get of the other resource being deleted = %+v; want NotFound", first)
			}
			e.sameVolume("after the other resource's deletion", "db.qcow2", overlay)
			e.sameVolume("after the other resource's deletion", "db-seed.iso", seed)

			err := e.reconcileSettled(req)
			if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "belong to another resource") {
				t.Errorf("Create of db for %+v = %v; want Permanent saying the volumes belong to another resource", mark, err)
			}
			if got := e.host.domainNames(); len(got) != 0 {
				t.Errorf("domains after the refused Create: %v", got)
			}
			e.sameVolume("after the other resource's Create", "db.qcow2", overlay)
			e.sameVolume("after the other resource's Create", "db-seed.iso", seed)

			createAndBoot(t, e, "db", "uid-owner")
			if v, _ := e.volSnapshot("db.qcow2"); string(v.content) != "the owner's disk" {
				t.Errorf("the owner's Create replaced its overlay")
			}
		})
	}
}
