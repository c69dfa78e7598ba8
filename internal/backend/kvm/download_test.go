package kvm

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// createError is what Create of req reports, at once or (for a failure in
// the background download) from the Get after it.
func (e *testEnv) createError(req proxy.Request) error {
	e.t.Helper()
	inst, err := e.d.Create(context.Background(), req)
	if err != nil {
		return err
	}
	e.waitBackgroundDone()
	_, err = e.d.Get(context.Background(), ref(inst))
	return err
}

// TestImage_refusedBeforeAnythingIsWritten: an image that does not fit is
// refused, naming why, and nothing lands in the pool, whatever its server
// says about its size.
func TestImage_refusedBeforeAnythingIsWritten(t *testing.T) {
	// Room for the overlay, the seed and 1 MiB; not for the 3 MiB image.
	tight := func(e *testEnv) { e.host.pools["default"].available = 10<<30 + seedReserve + 1<<20 }
	capped := func(e *testEnv) { e.cfg.MaxImageBytes = 1 << 20 }
	const capText = "more than the 1 MiB the config allows (kvm.maxImageSizeGiB)"
	cases := []struct {
		name  string
		setup []func(e *testEnv)
		class proxy.Class
		texts []string
	}{
		// The attack is an image server whose HEAD claims a tiny file and
		// whose GET streams one the pool has no room for: the pool is
		// checked again with the GET's size before anything is written.
		{"HeadThatLiesCannotPassThePoolCheck", []func(*testEnv){tight, func(e *testEnv) { e.images.headSize = 1024 }},
			proxy.ClassQuota, []string{"storage pool default on host lab", "image debian (3 MiB)"}},
		// A server that gives no size (no Content-Length on HEAD or GET)
		// is not read as a zero-byte image that fits any pool: the body is
		// spooled and its size measured before the pool is checked.
		{"UnknownSizeIsFetchedNotReadAsZero", []func(*testEnv){tight, func(e *testEnv) { e.images.chunked = true }},
			proxy.ClassQuota, []string{"image debian (3 MiB)"}},
		// An image above the config's cap is refused, whether the server
		// says so in its HEAD, only in its GET, or streams it without a
		// length.
		{"LargerThanTheCap/HonestHead", []func(*testEnv){capped}, proxy.ClassPermanent, []string{capText}},
		{"LargerThanTheCap/HeadLies", []func(*testEnv){capped, func(e *testEnv) { e.images.headSize = 1024 }},
			proxy.ClassPermanent, []string{capText}},
		{"LargerThanTheCap/HeadLiesAndBodyHasNoLength", []func(*testEnv){capped, func(e *testEnv) { e.images.headSize = 1024; e.images.chunked = true }},
			proxy.ClassPermanent, []string{capText}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, tc.setup...)
			err := e.createError(e.request("web", "uid-1"))
			if proxy.ClassOf(err) != tc.class {
				t.Fatalf("Create = %v (%s); want %s naming %q", err, proxy.ClassOf(err), tc.class, tc.texts)
			}
			for _, text := range tc.texts {
				if !strings.Contains(err.Error(), text) {
					t.Errorf("Create = %v; want it to name %q", err, text)
				}
			}
			if got := e.host.volNames(); len(got) != 0 {
				t.Errorf("volumes written: %v", got)
			}
		})
	}
}

// TestImage_concurrentDownloadsPerHost: with one download per host, a
// second image waits (and says so) until the first is in, then follows.
func TestImage_concurrentDownloadsPerHost(t *testing.T) {
	e := newTestEnv(t, func(e *testEnv) {
		e.cfg.MaxDownloadsPerHost = 1
		e.cfg.Images["other"] = Image{URL: e.images.URL + "/other.qcow2", SHA256: e.images.sha()}
	})
	release := e.images.holdBodies()
	defer release()
	first := e.mustCreate(e.request("a", "uid-a"))
	testenv.WaitFor(t, "the first download to start", 5*time.Second, func() (bool, string) {
		return e.images.gets.Load() == 1, e.mustGet(ref(first)).Progress
	})
	req := e.request("b", "uid-b")
	req.Placement.Image = "other"
	second := e.mustCreate(req)
	testenv.WaitFor(t, "the second download to wait", 5*time.Second, func() (bool, string) {
		p := e.mustGet(ref(second)).Progress
		return strings.Contains(p, "downloading image other: waiting for the downloads running on the host to finish"), p
	})
	if got := e.images.gets.Load(); got != 1 {
		t.Errorf("%d downloads ran at once; want 1", got)
	}
	release()
	createAndBoot(t, e, "a", "uid-a")
	b := createAndBootReq(t, e, req)
	if b.ID != second.ID || e.images.gets.Load() != 2 {
		t.Errorf("after the first download: second instance %q, %d downloads; want %q and 2", b.ID, e.images.gets.Load(), second.ID)
	}
}

// createAndBootReq is createAndBoot for a request of any placement.
func createAndBootReq(t *testing.T, e *testEnv, req proxy.Request) proxy.Instance {
	t.Helper()
	var inst proxy.Instance
	var err error
	for range 20 {
		inst, err = e.observeOrCreate(req)
		if err == nil && inst.ProxyReachable {
			return inst
		}
		e.waitBackground()
		if err == nil && inst.ID != "" {
			_ = e.settle(context.Background(), inst.ID)
		}
	}
	t.Fatalf("%s never became Running: %+v, %v", req.Name, inst, err)
	return inst
}

// TestImage_failedJobsAreForgotten: every failed download is dropped from
// the cache once its TTL is over, even if no one asks for its image again.
func TestImage_failedJobsAreForgotten(t *testing.T) {
	c := newImageCache()
	c.failedTTL = 0
	var wg sync.WaitGroup
	for _, u := range []string{"http://a.example/1", "http://a.example/2", "http://a.example/3"} {
		j, _ := c.start(u, resolvedImage{Key: "url", URL: u}, limits{}, &wg, func(*imageJob) func() error { return func() error { return proxy.Permanentf("404") } })
		<-j.done
	}
	c.start("http://a.example/ok", resolvedImage{Key: "url"}, limits{}, &wg, func(*imageJob) func() error { return func() error { return nil } })
	wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.jobs) != 0 {
		t.Errorf("the cache holds %d jobs after they failed or finished; want none", len(c.jobs))
	}
}

// TestPool_idleConnectionsAreClosed: a pooled connection no call asked for
// in connIdle (its config deleted, its host removed) is closed and
// forgotten; the one in use stays.
func TestPool_idleConnectionsAreClosed(t *testing.T) {
	e := newTestEnv(t, func(e *testEnv) {
		e.cfg.Hosts = append(e.cfg.Hosts, Host{Name: "lab2", Address: "fakehost2:22", User: "proxy", Bridge: "br0"})
	})
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e.b.pool.now = func() time.Time { return clock }
	ctx := context.Background()
	if _, err := e.d.List(ctx, testInstallation); err != nil {
		t.Fatal(err)
	}
	if got := e.b.pool.size(); got != 2 {
		t.Fatalf("%d connections pooled after listing two hosts; want 2", got)
	}
	// The config loses lab2; only lab is used from now on.
	cfg := e.cfg
	cfg.Hosts = cfg.Hosts[:1]
	d := e.b.Driver(cfg)
	clock = clock.Add(connIdle / 2)
	if _, err := d.List(ctx, testInstallation); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(connIdle/2 + time.Minute)
	closedBefore := e.host.closedConns()
	if _, err := d.List(ctx, testInstallation); err != nil {
		t.Fatal(err)
	}
	if got := e.b.pool.size(); got != 1 {
		t.Errorf("%d connections pooled after lab2's went unused for longer than %v; want 1", got, connIdle)
	}
	if e.host.closedConns() != closedBefore+1 {
		t.Errorf("lab2's idle connection was not closed")
	}
}

func (h *fakeHost) closedConns() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// TestImage_credentialsInTheURLStayOutOfErrors: an image URL holding a
// presigned signature or user info, whose server cannot be reached: the
// error (which becomes a condition) names the image, not the secret parts.
func TestImage_credentialsInTheURLStayOutOfErrors(t *testing.T) {
	const sig = "S3NT1NEL-signature-5c2e9a"
	e := newTestEnv(t, func(e *testEnv) {
		dead := e.images.URL // closed below: nothing answers there
		e.images.Close()
		e.cfg.Images["debian"] = Image{URL: strings.Replace(dead, "http://", "http://reader:"+sig+"@", 1) + "/debian.qcow2?X-Amz-Signature=" + sig}
	})
	err := e.createError(e.request("web", "uid-1"))
	if err == nil {
		t.Fatal("Create with an unreachable image server succeeded")
	}
	if strings.Contains(err.Error(), sig) || strings.Contains(e.logs.String(), sig) {
		t.Errorf("the URL's credentials leak: error %q", err)
	}
	if !strings.Contains(err.Error(), "image debian") {
		t.Errorf("error %q does not name the image", err)
	}
}
