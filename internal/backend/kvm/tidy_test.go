package kvm

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestTidyEvictsBaseImagesNoOverlayUses: a base image an overlay backs
// onto stays; once its last instance is deleted, the first Tidy only
// notes it unused and a later one, past the retention, deletes it and its
// marker; a retention of zero keeps it.
func TestTidyEvictsBaseImagesNoOverlayUses(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	bases := func() []string {
		var out []string
		for _, v := range e.host.volNames() {
			if strings.HasPrefix(v, basePrefix) {
				out = append(out, v)
			}
		}
		return out
	}
	inst := e.mustCreate(e.request("pt-tidy", "0c8f6a1e-5b7d-4e2a-9c3f-00000000000a"))
	if err := e.settle(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if len(bases()) != 2 {
		t.Fatalf("base volumes %v; want the image and its marker", bases())
	}
	for range 2 {
		if removed, err := e.d.Tidy(ctx); err != nil || len(removed) != 0 {
			t.Fatalf("Tidy with the image in use = %v, %v; want nothing removed", removed, err)
		}
	}
	if err := e.d.Delete(ctx, ref(inst)); err != nil {
		t.Fatal(err)
	}
	if removed, err := e.d.Tidy(ctx); err != nil || len(removed) != 0 || len(bases()) != 2 {
		t.Fatalf("the first Tidy after the image's last use = %v, %v (left %v); want it only noted", removed, err, bases())
	}

	keep := e.d
	e.cfg.UnusedImageRetention = 0
	e.d = e.b.Driver(e.cfg)
	if removed, err := e.d.Tidy(ctx); err != nil || len(removed) != 0 || len(bases()) != 2 {
		t.Fatalf("Tidy with retention 0 = %v, %v (left %v); want everything kept", removed, err, bases())
	}
	e.d = keep

	time.Sleep(time.Millisecond)
	removed, err := e.d.Tidy(ctx)
	if err != nil || len(removed) != 1 || !strings.Contains(removed[0], "base image "+basePrefix) || len(bases()) != 0 {
		t.Fatalf("Tidy past the retention = %v, %v (left %v); want the image and its marker deleted", removed, err, bases())
	}
}
