package kvm

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// tenantError is what a tenant's Create of req through d reports: at
// once, or from its Get once its own background work failed. It waits
// for nothing else on the backend (a platform download held half-way).
func tenantError(t *testing.T, d *Driver, req proxy.Request) error {
	t.Helper()
	inst, err := d.Create(context.Background(), req)
	if err != nil {
		return err
	}
	testenv.WaitFor(t, "the tenant's create to fail", 5*time.Second, func() (bool, string) {
		got, gerr := d.Get(context.Background(), ref(inst))
		err = gerr
		return err != nil, got.Progress
	})
	return err
}

// TestImage_tenantNeverSharesThePlatformsDownload: a platform config
// downloads its catalogue image from an intranet server (loopback here,
// which a tenant's download guard refuses); a namespaced config on the
// same host names the same URL under the same key. Whether the
// platform's download is running, has failed or has finished, the
// tenant's Create is refused as its own guard refuses that address: it
// does not join the platform's download, see its progress or error (the
// intranet server's status text), or boot from the base it left in the
// pool, and the server is not asked again for it.
func TestImage_tenantNeverSharesThePlatformsDownload(t *testing.T) {
	const sentinel = "SENTINEL-intranet-detail"
	cases := []struct {
		name string
		// platform starts the platform's download on e and returns what
		// counts the server's requests.
		platform func(t *testing.T, e *testEnv) *atomic.Int32
	}{
		{"WhileItRuns", func(t *testing.T, e *testEnv) *atomic.Int32 {
			t.Cleanup(e.images.holdBodies())
			inst := e.mustCreate(e.request("platform", "uid-platform"))
			testenv.WaitFor(t, "the platform's download to start", 5*time.Second, func() (bool, string) {
				p := e.mustGet(ref(inst)).Progress
				return strings.Contains(p, "%"), p
			})
			return &e.images.gets
		}},
		{"AfterItFailed", func(t *testing.T, e *testEnv) *atomic.Int32 {
			addr, hits := rawServer(t, "127.0.0.1:0", "HTTP/1.1 404 "+sentinel+"\r\nContent-Length: 0\r\n\r\n")
			e.cfg.Images["debian"] = Image{URL: "http://" + addr + "/debian.qcow2"}
			e.d = e.b.Driver(e.cfg)
			if err := e.createError(e.request("platform", "uid-platform")); err == nil || !strings.Contains(err.Error(), sentinel) {
				t.Fatalf("the platform's Create = %v; want the server's status text", err)
			}
			return hits
		}},
		{"AfterItFinished", func(t *testing.T, e *testEnv) *atomic.Int32 {
			createAndBoot(t, e, "platform", "uid-platform")
			return &e.images.gets
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			asked := tc.platform(t, e)
			before := asked.Load()
			tenant := e.cfg
			tenant.Name = "ProviderConfig team-a/own-kvm"
			tenant.Guard = onlyAllowing(t)
			err := tenantError(t, e.b.Driver(tenant), e.request("tenant", "uid-tenant"))
			if !netguard.IsRefused(err) || proxy.ClassOf(err) != proxy.ClassPermanent || !strings.Contains(err.Error(), "does not connect to 127.0.0.1") {
				t.Errorf("the tenant's Create = %v (%s); want a Permanent refusal of 127.0.0.1, as its own guard refuses it", err, proxy.ClassOf(err))
			}
			if err != nil && strings.Contains(err.Error(), sentinel) {
				t.Errorf("the tenant's Create quotes the intranet server: %v", err)
			}
			if slices.Contains(e.host.domainNames(), "tenant") {
				t.Error("the tenant's proxy was defined from the platform's download")
			}
			if n := asked.Load() - before; n != 0 {
				t.Errorf("the intranet server was asked %d more times for the tenant; want 0", n)
			}
		})
	}
}
