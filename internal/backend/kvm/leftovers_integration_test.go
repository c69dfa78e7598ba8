package kvm_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestIntegrationLibvirtListReportsVolumesWithoutDomain: on the real
// libvirtd, a domain removed by hand (virsh destroy and undefine: the
// resource's deletion bypassed) leaves its overlay and seed; List reports
// them, with the mark the seed carries, to this installation alone; a
// Delete for another UID leaves them; a Delete by what List returned (as
// the orphan sweep does) removes both and leaves the shared base image.
func TestIntegrationLibvirtListReportsVolumesWithoutDomain(t *testing.T) {
	e := newFaultEnv(t)
	ctx := context.Background()
	req := e.request("egp-left-vols")
	e.reconcile(req)
	e.h.Virsh(t, "destroy", req.Name)
	e.h.Virsh(t, "undefine", req.Name)

	l, err := e.d.List(ctx, req.Mark.InstallationID)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(l, func(i proxy.Instance) bool { return i.Name == req.Name })
	if i < 0 {
		t.Fatalf("List = %+v; want the volumes of %s reported", l, req.Name)
	}
	got := l[i]
	want := []string{"overlay " + req.Name + ".qcow2", "seed " + req.Name + "-seed.iso"}
	if got.Mark != req.Mark || !slices.Equal(got.Leftovers, want) || got.ID != "hosts/local/domains/"+req.Name || got.CreatedAt.IsZero() || got.Placement.Location != "local" {
		t.Errorf("List reports %+v; want the resource's mark, leftovers %v, its ID and the seed's time", got, want)
	}
	if other, err := e.d.List(ctx, "another-installation"); err != nil || slices.ContainsFunc(other, func(i proxy.Instance) bool { return i.Name == req.Name }) {
		t.Errorf("List of another installation = %+v, %v; want nothing of %s", other, err, req.Name)
	}

	// Another resource of the name may not take them: the seed's mark is
	// not its own.
	foreign := proxy.Ref{ID: got.ID, Name: got.Name, Mark: proxy.Mark{UID: "0c8f6a1e-0000-4e2a-9c3f-000000000001", InstallationID: req.Mark.InstallationID}, Live: true}
	_ = e.d.Delete(ctx, foreign)
	if _, vols := e.pieces(req.Name); len(vols) != 2 {
		t.Errorf("a Delete for another UID left volumes %v; want both", vols)
	}

	if err := e.d.Delete(ctx, proxy.Ref{ID: got.ID, Name: got.Name, Mark: got.Mark, Live: true}); err != nil {
		t.Fatalf("Delete by what List returned: %v", err)
	}
	if doms, vols := e.pieces(req.Name); len(doms)+len(vols) > 0 {
		t.Errorf("after the Delete, left on the host: domains %v, volumes %v", doms, vols)
	}
	if !slices.Contains(e.h.Volumes(t), e.base()) {
		t.Error("the Delete removed the shared base image")
	}
}

// TestIntegrationLibvirtTidyEvictsUnusedBaseImage: on the real libvirtd, a
// base image stays while an overlay backs onto it; once the last proxy
// using it is deleted, a Tidy past the retention deletes it and its marker.
// In a pool of its own: the shared pool holds other tests' images.
func TestIntegrationLibvirtTidyEvictsUnusedBaseImage(t *testing.T) {
	var pool *smallPool
	e := newFaultEnv(t, func(e *faultEnv) {
		pool = newSmallPool(t, e.h, "egp-tidy-pool", 2048)
		e.cfg.Hosts[0].Pool = pool.name
		e.cfg.UnusedImageRetention = time.Nanosecond
	})
	ctx := context.Background()
	req := e.request("egp-tidy")
	e.reconcile(req)
	// List names each domain's host: what the orphan sweep remembers of a
	// host should it leave the config.
	l, err := e.d.List(ctx, req.Mark.InstallationID)
	if i := slices.IndexFunc(l, func(i proxy.Instance) bool { return i.Name == req.Name }); err != nil || i < 0 || l[i].Placement.Location != "local" {
		t.Errorf("List = %+v, %v; want %s on host local", l, err, req.Name)
	}
	has := func(v string) bool { return slices.Contains(pool.volumes(), v) }
	for range 2 {
		if removed, err := e.d.Tidy(ctx); err != nil || len(removed) != 0 {
			t.Fatalf("Tidy with the image in use = %v, %v; want nothing removed", removed, err)
		}
	}
	if !has(e.base()) || !has(e.base()+".sha256") {
		t.Fatal("the base image in use was removed")
	}
	e.deleteAsTheController(liveRef(req))
	if _, err := e.d.Tidy(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond)
	removed, err := e.d.Tidy(ctx)
	if err != nil || len(removed) != 1 || has(e.base()) || has(e.base()+".sha256") {
		t.Errorf("Tidy past the retention = %v, %v; want the base image and its marker deleted (left: %v)", removed, err, pool.volumes())
	}
}
