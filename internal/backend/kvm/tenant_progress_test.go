package kvm

import (
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// TestImage_tenantProgressDoesNotQuoteTheDeclaredSize: a tenant's
// download in progress says how far it is, not the size its server
// declared, as its size and pool errors do not; the platform's says both.
func TestImage_tenantProgressDoesNotQuoteTheDeclaredSize(t *testing.T) {
	for _, tenant := range []bool{false, true} {
		e := newTestEnv(t, func(e *testEnv) {
			if tenant {
				e.cfg.Guard = onlyAllowing(t)
				e.cfg.Images["debian"] = Image{URL: mirrorURL, SHA256: e.images.sha()}
			}
		})
		if tenant {
			e.throughProxy(e.images.Listener.Addr().String())
		}
		release := e.images.holdBodies()
		inst := e.mustCreate(e.request("web", "uid-web"))
		var p string
		testenv.WaitFor(t, "the download to be half-way", 5*time.Second, func() (bool, string) {
			p = e.mustGet(ref(inst)).Progress
			return strings.Contains(p, "50%"), p
		})
		release()
		if quotes := strings.Contains(p, "3 MiB"); quotes == tenant {
			t.Errorf("tenant %v: progress %q; want the declared size (3 MiB) shown to the platform only", tenant, p)
		}
	}
}
