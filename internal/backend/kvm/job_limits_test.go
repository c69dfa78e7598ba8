package kvm

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// joinerError is what the Create of req through d reports: at once,
// or, after then (called once Create returned), from a Get of it.
func joinerError(t *testing.T, d *Driver, req proxy.Request, then func()) error {
	t.Helper()
	inst, err := d.Create(context.Background(), req)
	then()
	if err != nil {
		return err
	}
	testenv.WaitFor(t, "the joining create to fail", 5*time.Second, func() (bool, string) {
		got, gerr := d.Get(context.Background(), ref(inst))
		err = gerr
		return err != nil, got.Progress
	})
	return err
}

// TestImage_joinerKeepsItsOwnSizeCap: a config capping images at 1 MiB
// names the same image (3 MiB) as a config with the default cap, whose
// download is running, on the same host. The server's HEAD gives no true
// size, so the small config's Create joins that download; it is refused
// as it would have been downloading alone (Permanent, naming the field
// and its own cap), while the download goes on for the other config,
// whose proxy boots, and the small config's proxy is never defined, not
// even by its next Create, which finds the image in the pool.
func TestImage_joinerKeepsItsOwnSizeCap(t *testing.T) {
	const declared = "image debian is 3 MiB, more than the 1 MiB the config allows (kvm.maxImageSizeGiB)"
	const streamed = "image debian streams more than the 1 MiB the config allows (kvm.maxImageSizeGiB)"
	cases := []struct {
		name  string
		setup func(e *testEnv)
		// ended is whether the download is let finish before the small
		// config's Create is asked again (the finished image is checked),
		// rather than held half-way (its progress is).
		ended bool
		want  string
	}{
		{"DeclaredByTheGET/WhileItRuns", func(e *testEnv) { e.images.headSize = 1024 }, false, declared},
		{"DeclaredByTheGET/AfterItEnded", func(e *testEnv) { e.images.headSize = 1024 }, true, declared},
		{"StreamedWithoutALength/WhileItRuns", func(e *testEnv) { e.images.headSize = 1024; e.images.chunked = true }, false, streamed},
		{"StreamedWithoutALength/AfterItEnded", func(e *testEnv) { e.images.headSize = 1024; e.images.chunked = true }, true, streamed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			useSpool(t, 64<<20)
			e := newTestEnv(t, tc.setup)
			release := e.images.holdBodies()
			defer release()
			big := e.mustCreate(e.request("big", "uid-big"))
			testenv.WaitFor(t, "the big config's download to start", 5*time.Second, func() (bool, string) {
				return e.images.gets.Load() == 1, e.mustGet(ref(big)).Progress
			})
			small := e.cfg
			small.MaxImageBytes = 1 << 20
			then := func() {}
			if tc.ended {
				then = func() {
					release()
					e.waitBackgroundDone()
				}
			}
			err := joinerError(t, e.b.Driver(small), e.request("small", "uid-small"), then)
			if proxy.ClassOf(err) != proxy.ClassPermanent || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("the small config's Create = %v (%s); want Permanent %q", err, proxy.ClassOf(err), tc.want)
			}
			release()
			createAndBoot(t, e, "big", "uid-big")
			e.waitBackgroundDone()
			if slices.Contains(e.host.domainNames(), "small") {
				t.Error("the small config's proxy was defined from an image above its cap")
			}
			_, err = e.b.Driver(small).Create(context.Background(), e.request("small", "uid-small"))
			e.waitBackgroundDone()
			if proxy.ClassOf(err) != proxy.ClassPermanent || err == nil || !strings.Contains(err.Error(), "(kvm.maxImageSizeGiB)") {
				t.Errorf("the small config's next Create = %v (%s); want Permanent, naming kvm.maxImageSizeGiB", err, proxy.ClassOf(err))
			}
			if slices.Contains(e.host.domainNames(), "small") {
				t.Error("the small config's next Create defined its proxy from the image in the pool, above its cap")
			}
			if n := e.images.gets.Load(); n != 1 {
				t.Errorf("the image was downloaded %d times; want once, for the big config", n)
			}
		})
	}
}

// TestImage_baseInThePoolIsHeldToTheCap: the 3 MiB image is in the pool,
// downloaded for a config with the default cap. A config capping images
// at 1 MiB that names it is refused as if it downloaded it (Permanent,
// naming the field and its cap; a tenant's config without the image's
// size), without downloading it again, and its proxy is never defined; a
// config whose cap the image fits boots from it.
func TestImage_baseInThePoolIsHeldToTheCap(t *testing.T) {
	cases := []struct {
		name   string
		tenant bool
		want   string
	}{
		{"Platform", false, "image debian is 3 MiB, more than the 1 MiB the config allows (kvm.maxImageSizeGiB)"},
		{"Tenant", true, "image debian is larger than the 1 MiB the config allows (kvm.maxImageSizeGiB)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, func(e *testEnv) {
				if tc.tenant {
					e.cfg.Guard = onlyAllowing(t, "127.0.0.0/8")
					e.cfg.Images["debian"] = Image{URL: mirrorURL, SHA256: e.images.sha()}
				}
			})
			if tc.tenant {
				e.throughProxy(e.images.Listener.Addr().String())
			}
			createAndBoot(t, e, "big", "uid-big")
			small := e.cfg
			small.MaxImageBytes = 1 << 20
			_, err := e.b.Driver(small).Create(context.Background(), e.request("small", "uid-small"))
			e.waitBackgroundDone()
			if proxy.ClassOf(err) != proxy.ClassPermanent || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("the small config's Create = %v (%s); want Permanent %q", err, proxy.ClassOf(err), tc.want)
			}
			if slices.Contains(e.host.domainNames(), "small") {
				t.Error("the small config's proxy was defined from an image in the pool above its cap")
			}
			if n := e.images.gets.Load(); n != 1 {
				t.Errorf("the image was downloaded %d times; want once, for the big config", n)
			}
			fits := e.cfg
			fits.MaxImageBytes = 3 << 20
			e.d = e.b.Driver(fits)
			createAndBoot(t, e, "fits", "uid-fits")
		})
	}
}

// TestImage_joinerIsNotRefusedAtAnotherConfigsLimits: a config's proxy
// starts the download of a 3 MiB image (its HEAD lies) and is refused
// at that config's limit: its cap of 1 MiB, or a pool without room for
// the image and its 20 GB disk. A config whose limits the image fits,
// naming the same image right after, is not handed that refusal, which
// names limits not its own: its proxy boots from its own download.
func TestImage_joinerIsNotRefusedAtAnotherConfigsLimits(t *testing.T) {
	cases := []struct {
		name    string
		setup   func(e *testEnv)
		refused func(c *Config)
		want    string
	}{
		{"Cap", func(e *testEnv) { e.images.headSize = 1024 },
			func(c *Config) { c.MaxImageBytes = 1 << 20 }, "more than the 1 MiB the config allows"},
		{"PoolNeed", func(e *testEnv) {
			e.images.headSize = 1024
			e.host.pools["default"].available = 20<<30 + seedReserve + 1<<20
		}, func(c *Config) { c.DiskSizeGB = 20 }, "and the proxy need 20499 MiB"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, tc.setup)
			refused := e.cfg
			tc.refused(&refused)
			fits := e.d
			e.d = e.b.Driver(refused)
			if err := e.createError(e.request("refused", "uid-refused")); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("the first config's Create = %v; want %q", err, tc.want)
			}
			e.d = fits
			createAndBoot(t, e, "fits", "uid-fits")
		})
	}
}

// TestImage_joinerKeepsItsOwnPoolNeed: a config whose proxies have 20 GB
// disks joins the download a 10 GB config's proxy started, on a pool
// with room for the 3 MiB image and 20 GB, not for both (the server's
// HEAD claimed a tiny file). Once the GET declares the size, the joining
// proxy fails PoolFull, as it would have downloading alone; the other
// boots.
func TestImage_joinerKeepsItsOwnPoolNeed(t *testing.T) {
	e := newTestEnv(t, func(e *testEnv) {
		e.images.headSize = 1024
		e.host.pools["default"].available = 20<<30 + seedReserve + 1<<20
	})
	release := e.images.holdBodies()
	defer release()
	small := e.mustCreate(e.request("small", "uid-small"))
	testenv.WaitFor(t, "the 10 GB config's download to start", 5*time.Second, func() (bool, string) {
		p := e.mustGet(ref(small)).Progress
		return strings.Contains(p, "%"), p
	})
	large := e.cfg
	large.DiskSizeGB = 20
	err := joinerError(t, e.b.Driver(large), e.request("large", "uid-large"), func() {})
	const want = "storage pool default on host lab has 20497 MiB available; image debian (3 MiB) and the proxy need 20499 MiB"
	if proxy.ClassOf(err) != proxy.ClassQuota || err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("the 20 GB config's Create = %v (%s); want Quota %q", err, proxy.ClassOf(err), want)
	}
	release()
	createAndBoot(t, e, "small", "uid-small")
	e.waitBackgroundDone()
	if slices.Contains(e.host.domainNames(), "large") {
		t.Error("the 20 GB config's proxy was defined on a pool without room for it")
	}
}

// TestImage_baseHeldToTheCapByItsFileNotItsVirtualSize: after a pool
// refresh libvirt reads a qcow2 base's virtual size as its capacity, many
// times the image's bytes; the cap holds the bytes the download wrote, so
// a config whose cap the file fits boots from it.
func TestImage_baseHeldToTheCapByItsFileNotItsVirtualSize(t *testing.T) {
	e := newTestEnv(t)
	createAndBoot(t, e, "big", "uid-big")
	for name, v := range e.host.pools["default"].vols {
		if strings.HasPrefix(name, "egressproxy-base-") && !strings.HasSuffix(name, ".sha256") {
			v.format, v.capacity = "qcow2", 2<<30
		}
	}
	fits := e.cfg
	fits.MaxImageBytes = 4 << 20
	e.d = e.b.Driver(fits)
	createAndBoot(t, e, "fits", "uid-fits")
}
