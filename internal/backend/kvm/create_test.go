package kvm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// observeOrCreate is one reconcile as the controller does it: Get, and
// Create when the instance does not exist.
func (e *testEnv) observeOrCreate(req proxy.Request) (proxy.Instance, error) {
	r := proxy.Ref{ID: formatID("lab", req.Name), Name: req.Name, Mark: req.Mark, Placement: req.Placement}
	inst, err := e.d.Get(context.Background(), r)
	if proxy.IsNotFound(err) {
		return e.d.Create(context.Background(), req)
	}
	return inst, err
}

// reconcileSettled is what reconciling req reports once its create's
// background work (the download, the domain's definition) is done: the
// error of the first reconcile, else of the one after that work.
func (e *testEnv) reconcileSettled(req proxy.Request) error {
	_, err := e.observeOrCreate(req)
	if err == nil {
		e.waitBackgroundDone()
		_, err = e.observeOrCreate(req)
	}
	return err
}

// waitBackground waits until no create of this backend is pending.
func (e *testEnv) waitBackground() {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		e.b.mu.Lock()
		n := 0
		for _, pe := range e.b.pending {
			if pe.failure() == nil {
				n++
			}
		}
		e.b.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatal("background work did not finish")
}

// TestCreate_resumesAfterCrashAtEveryStep stops the provider at every
// backend call a Create makes (the call fails, and so does every later
// one; an upload cut off leaves half its bytes), restarts it with no
// memory, and reconciles again: the proxy comes up with exactly one
// domain, one overlay, one seed, one verified base image, and Delete
// leaves only the shared base.
func TestCreate_resumesAfterCrashAtEveryStep(t *testing.T) {
	for _, cached := range []bool{false, true} {
		t.Run(fmt.Sprintf("imageCached=%t", cached), func(t *testing.T) {
			// A reference run counts the calls of one full create.
			refEnv := newTestEnv(t)
			if cached {
				warm(t, refEnv)
			}
			before := refEnv.host.ncallsNow()
			createAndBoot(t, refEnv, "web", "uid-1")
			n := refEnv.host.ncallsNow() - before
			if n < 10 {
				t.Fatalf("a full create made only %d calls", n)
			}
			for k := 1; k <= n; k++ {
				e := newTestEnv(t)
				if cached {
					warm(t, e)
				}
				e.host.setCrashAt(e.host.ncallsNow() + k)
				req := e.request("web", "uid-1")
				_, _ = e.observeOrCreate(req)
				e.waitBackground()
				e.crash()
				e.host.setCrashAt(0)
				inst := createAndBoot(t, e, "web", "uid-1")
				where := fmt.Sprintf("crash at call %d of %d (%s)", k, n, e.host.callAt(before+k))
				if inst.State != proxy.StateRunning || !inst.ProxyReachable || inst.Mark != req.Mark {
					t.Errorf("%s: after resuming: %+v", where, inst)
				}
				if diff := cmp.Diff([]string{"web"}, e.host.domainNames()); diff != "" {
					t.Errorf("%s: domains (-want +got):\n%s", where, diff)
				}
				base := imageOf(e).volume()
				want := []string{base, base + ".sha256", "web-seed.iso", "web.qcow2"}
				slices.Sort(want)
				if diff := cmp.Diff(want, e.host.volNames()); diff != "" {
					t.Errorf("%s: volumes (-want +got):\n%s", where, diff)
				}
				e.checkVolumes(where, base)
				if err := e.d.Delete(context.Background(), ref(inst)); err != nil {
					t.Fatalf("%s: Delete: %v", where, err)
				}
				if got := e.host.domainNames(); len(got) != 0 {
					t.Errorf("%s: domains left after Delete: %v", where, got)
				}
				if diff := cmp.Diff([]string{base, base + ".sha256"}, e.host.volNames()); diff != "" {
					t.Errorf("%s: volumes after Delete (-want +got):\n%s", where, diff)
				}
			}
		})
	}
}

// checkVolumes asserts the base holds the image, the marker its digest,
// the seed a whole ISO, the overlay backs onto the base.
func (e *testEnv) checkVolumes(where, base string) {
	e.t.Helper()
	e.host.mu.Lock()
	defer e.host.mu.Unlock()
	vols := e.host.pools["default"].vols
	if got := vols[base].content; string(got) != string(e.images.content) {
		e.t.Errorf("%s: base holds %d bytes, not the image's %d", where, len(got), len(e.images.content))
	}
	if got := string(vols[base+".sha256"].content); got != e.images.sha() {
		e.t.Errorf("%s: marker holds %q", where, got)
	}
	seed := vols["web-seed.iso"]
	if uint64(len(seed.content)) != seed.capacity || len(seed.content) < 32774 || string(seed.content[32769:32774]) != "CD001" {
		e.t.Errorf("%s: the seed is not a whole ISO (%d of %d bytes)", where, len(seed.content), seed.capacity)
	}
	if o := vols["web.qcow2"]; o.backing != "/var/lib/libvirt/images/"+base || o.capacity != 10<<30 {
		e.t.Errorf("%s: overlay backs onto %q with capacity %d", where, o.backing, o.capacity)
	}
}

func imageOf(e *testEnv) resolvedImage {
	img, _ := e.d.image("debian")
	return img
}

// warm puts the base image into the pool.
func warm(t *testing.T, e *testEnv) {
	t.Helper()
	createAndBoot(t, e, "warm", "uid-warm")
	if err := e.d.Delete(context.Background(), proxy.Ref{ID: formatID("lab", "warm"), Name: "warm", Mark: proxy.Mark{UID: "uid-warm", InstallationID: "test-install"}}); err != nil {
		t.Fatal(err)
	}
}

// createAndBoot reconciles until the instance is Running and answering.
func createAndBoot(t *testing.T, e *testEnv, name, uid string) proxy.Instance {
	t.Helper()
	return createAndBootReq(t, e, e.request(name, uid))
}

func (h *fakeHost) ncallsNow() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ncalls
}

func (h *fakeHost) setCrashAt(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.crashAt = n
}

func (h *fakeHost) callAt(i int) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i-1 < len(h.calls) && i >= 1 {
		return h.calls[i-1].method + " " + h.calls[i-1].arg
	}
	return "?"
}

// TestCreate_neverBlocksOnImageDownload: with the image not cached, Create
// returns at once; Get reports the download's progress in percent; the
// domain follows in the background once the image is in.
func TestCreate_neverBlocksOnImageDownload(t *testing.T) {
	e := newTestEnv(t)
	release := e.images.holdBodies()
	defer release()
	start := time.Now()
	inst := e.mustCreate(e.request("web", "uid-1"))
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Create took %v while the image downloads", took)
	}
	if inst.State != proxy.StateProvisioning || !strings.Contains(inst.Progress, "downloading image debian") {
		t.Errorf("Create: %+v", inst)
	}
	var got proxy.Instance
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		got = e.mustGet(ref(inst))
		if strings.Contains(got.Progress, "50%") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(got.Progress, "downloading image debian: 50% (1 of 3 MiB)") || got.State != proxy.StateProvisioning {
		t.Errorf("Get during the download: State %q, Progress %q; want Provisioning at 50%%", got.State, got.Progress)
	}
	if len(e.host.domainNames()) != 0 {
		t.Errorf("a domain was defined before its image was in")
	}
	release()
	if err := e.settle(context.Background(), inst.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.mustGet(ref(inst)); got.State != proxy.StateRunning || !got.ProxyReachable || got.CreatedAt != inst.CreatedAt {
		t.Errorf("after the download: %+v (Create said CreatedAt %v)", got, inst.CreatedAt)
	}
}

// TestImage_sharedByConcurrentCreates: three proxies on one image, one
// download, one base.
func TestImage_sharedByConcurrentCreates(t *testing.T) {
	e := newTestEnv(t)
	release := e.images.holdBodies()
	for _, n := range []string{"a", "b", "c"} {
		e.mustCreate(e.request(n, "uid-"+n))
	}
	release()
	for _, n := range []string{"a", "b", "c"} {
		createAndBoot(t, e, n, "uid-"+n)
	}
	if got := e.images.gets.Load(); got != 1 {
		t.Errorf("the image was downloaded %d times; want once", got)
	}
	if got := len(e.host.callsOf("StorageVolCreateXML")); got != 2+3*2 {
		t.Errorf("%d volumes created; want base, marker and an overlay and a seed per proxy", got)
	}
}

// TestImage_downloadUsesADedicatedConnection: the download runs on its
// own connection, so cancelling a reconcile cannot cut it off.
func TestImage_downloadUsesADedicatedConnection(t *testing.T) {
	e := newTestEnv(t)
	inst := createAndBoot(t, e, "web", "uid-1")
	_ = inst
	uploads := e.host.callsOf("StorageVolUpload")
	lookups := e.host.callsOf("DomainLookupByName")
	if uploads[0].conn == lookups[0].conn {
		t.Errorf("the image upload ran on the pooled connection %d", uploads[0].conn)
	}
	if e.host.closed < 1 {
		t.Errorf("the download's connection was not closed")
	}
}

func TestImage_failures(t *testing.T) {
	cases := []struct {
		name  string
		setup func(e *testEnv)
		class proxy.Class
		want  string
	}{
		{"Sha256Mismatch", func(e *testEnv) {
			im := e.cfg.Images["debian"]
			im.SHA256 = strings.Repeat("ab", 32)
			e.cfg.Images["debian"] = im
		}, proxy.ClassPermanent, "sha256 is"},
		{"NotFound", func(e *testEnv) { e.images.status = 404 }, proxy.ClassPermanent, "404 Not Found"},
		{"ServerError", func(e *testEnv) { e.images.status = 503 }, proxy.ClassTransient, "503"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, tc.setup)
			inst, err := e.d.Create(context.Background(), e.request("web", "uid-1"))
			if err == nil {
				e.waitBackgroundDone()
				_, err = e.d.Get(context.Background(), ref(inst))
			}
			if proxy.ClassOf(err) != tc.class || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v (%s); want %s containing %q", err, proxy.ClassOf(err), tc.class, tc.want)
			}
			var pe *proxy.Error
			if !errors.As(err, &pe) || pe.Provider != testProvider || pe.Op == "" {
				t.Errorf("error %v lacks provider or op", err)
			}
			if got := e.host.volNames(); len(got) != 0 {
				t.Errorf("volumes left: %v", got)
			}
			// Reported once; the failed download is remembered a while, so
			// an immediate retry is not a new download.
			if _, err := e.d.Create(context.Background(), e.request("web", "uid-1")); err == nil {
				t.Error("a retry right after a failed download succeeded; want the failure remembered")
			}
			e.waitBackgroundDone()
			if tc.class == proxy.ClassPermanent && e.images.gets.Load() > 1 {
				t.Errorf("the image was fetched %d times", e.images.gets.Load())
			}
		})
	}
}

// waitBackgroundDone waits until every pending create has finished,
// failed ones included.
func (e *testEnv) waitBackgroundDone() {
	// Every background create's goroutine, to its end: a finished create
	// leaves the pending map before its span ends.
	done := make(chan struct{})
	go func() {
		e.b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		e.t.Fatal("background work did not finish")
	}
}

// TestImage_withoutContentLength: a chunked mirror is spooled to disk and
// works.
func TestImage_withoutContentLength(t *testing.T) {
	e := newTestEnv(t, func(e *testEnv) { e.images.chunked = true })
	createAndBoot(t, e, "web", "uid-1")
	e.checkVolumes("chunked", imageOf(e).volume())
}

// TestImage_markerOfAnotherDigestIsPermanent: a base whose marker says
// other content is never replaced under running overlays.
func TestImage_markerOfAnotherDigestIsPermanent(t *testing.T) {
	e := newTestEnv(t)
	warm(t, e)
	e.host.mu.Lock()
	e.host.pools["default"].vols[imageOf(e).marker()].content = []byte(strings.Repeat("cd", 32))
	e.host.mu.Unlock()
	_, err := e.d.Create(context.Background(), e.request("web", "uid-1"))
	if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "it is not replaced") {
		t.Fatalf("Create = %v; want Permanent", err)
	}
}

// TestCreate_poolSpacePrecheckIsQuota: not enough room is Quota, before
// anything is created.
func TestCreate_poolSpacePrecheckIsQuota(t *testing.T) {
	e := newTestEnv(t)
	e.host.pools["default"].available = 5 << 30
	_, err := e.d.Create(context.Background(), e.request("web", "uid-1"))
	if !proxy.IsQuota(err) || !strings.Contains(err.Error(), "storage pool default on host lab has 5120 MiB available; this proxy needs 10259 MiB") {
		t.Fatalf("Create = %v (%s); want Quota naming the pool and sizes", err, proxy.ClassOf(err))
	}
	if got := e.host.volNames(); len(got) != 0 {
		t.Errorf("volumes created: %v", got)
	}
}

// TestCreate_hostMemoryPrecheckIsQuota: a host without the machine type's
// memory available is Quota, before anything is created.
func TestCreate_hostMemoryPrecheckIsQuota(t *testing.T) {
	e := newTestEnv(t)
	e.host.memAvailable = 256 << 20
	req := e.request("web", "uid-1")
	_, err := e.d.Create(context.Background(), req)
	if !proxy.IsQuota(err) || !strings.Contains(err.Error(), "host lab has 256 MiB of memory available; machine type "+req.Placement.MachineType+" needs") {
		t.Fatalf("Create = %v (%s); want Quota naming the host, its memory and the machine type", err, proxy.ClassOf(err))
	}
	if got := e.host.volNames(); len(got) != 0 {
		t.Errorf("volumes created: %v", got)
	}
	// With room on the host, the same Create goes on.
	e.host.memAvailable = 0
	if _, err := e.d.Create(context.Background(), req); err != nil && proxy.IsQuota(err) {
		t.Errorf("Create on a host with room = %v", err)
	}
}

// TestCreate_replacesAnOverlayThatDoesNotMatch: an overlay left behind on
// another base image or size, used by no domain, is replaced, not reused.
func TestCreate_replacesAnOverlayThatDoesNotMatch(t *testing.T) {
	e := newTestEnv(t)
	warm(t, e)
	e.host.mu.Lock()
	e.host.pools["default"].vols["web.qcow2"] = &fakeVol{name: "web.qcow2", format: "qcow2", capacity: 1 << 30, backing: "/var/lib/libvirt/images/egressproxy-base-older-0123456789ab.qcow2"}
	e.host.mu.Unlock()
	createAndBoot(t, e, "web", "uid-1")
	e.checkVolumes("stale overlay", imageOf(e).volume())
}

// TestCreate_placementErrorsArePermanentBeforeAnyCall.
func TestCreate_placementErrorsArePermanentBeforeAnyCall(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct {
		mutate func(*proxy.Request)
		want   string
	}{
		{func(r *proxy.Request) { r.Placement.Location = "nas1" }, `host "nas1" is not in the config's kvm.hosts (lab)`},
		{func(r *proxy.Request) { r.Placement.MachineType = "huge" }, `machine type "huge"`},
		{func(r *proxy.Request) { r.Placement.Image = "arch" }, `image "arch" is neither`},
		{func(r *proxy.Request) { r.Name = "Bad_Name" }, `not a valid domain name`},
		{func(r *proxy.Request) { r.Proxy.AllowedClientCIDRs = nil }, `allowedClientCIDRs`},
	} {
		req := e.request("web", "uid-1")
		tc.mutate(&req)
		_, err := e.d.Create(context.Background(), req)
		if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Create = %v; want Permanent containing %q", err, tc.want)
		}
	}
	if n := e.dials.Load(); n != 0 {
		t.Errorf("%d dials for invalid requests", n)
	}
}

// TestCreate_cloudInitSentinelNeverLoggedOrInErrors covers the user-data
// at every log level, including failures.
func TestCreate_cloudInitSentinelNeverLoggedOrInErrors(t *testing.T) {
	const sentinel = "ci-S3NT1NEL-0x5eed"
	e := newTestEnv(t)
	req := e.request("web", "uid-1")
	req.CloudInit = "#cloud-config\nruncmd:\n  - echo " + sentinel + "\n"
	createAndBoot(t, e, "web", "uid-1")
	_, _ = e.d.Create(context.Background(), req)
	e.host.failNext["StorageVolUpload"] = []error{lverr(1, "internal error")}
	req.Name = "web2"
	inst, err := e.d.Create(context.Background(), req)
	for _, s := range []string{e.logs.String(), fmt.Sprint(err), fmt.Sprintf("%+v", inst)} {
		if strings.Contains(s, sentinel) {
			t.Fatalf("the cloud-init sentinel leaked: %s", s)
		}
	}
	for _, sp := range e.spans.Ended() {
		for _, a := range sp.Attributes() {
			if strings.Contains(a.Value.String(), sentinel) {
				t.Fatalf("span %s attribute %s leaks the sentinel", sp.Name(), a.Key)
			}
		}
	}
}

// deleteAsTheController is a resource's deletion as the controller runs
// it: Get with Ref.Deleting, Delete while Get finds something, until Get
// says NotFound. It returns what the first Get reported.
func (e *testEnv) deleteAsTheController(r proxy.Ref) proxy.Instance {
	e.t.Helper()
	r.Deleting, r.Live = true, true
	var first proxy.Instance
	for i := range 10 {
		inst, err := e.d.Get(context.Background(), r)
		if proxy.IsNotFound(err) {
			return first
		}
		if err != nil {
			e.t.Fatalf("Get of the resource being deleted: %v", err)
		}
		if i == 0 {
			first = inst
		}
		if inst.Mark != r.Mark {
			e.t.Fatalf("Get of the resource being deleted reports mark %+v, not the resource's", inst.Mark)
		}
		if err := e.d.Delete(context.Background(), r); err != nil {
			e.t.Fatalf("Delete: %v", err)
		}
		e.waitBackgroundDone()
	}
	e.t.Fatal("the deletion never ended: Get keeps finding the instance")
	return first
}

// TestDelete_afterACrashAtEveryCreateStepLeavesNothing stops the provider
// at every backend call of a Create, restarts it with no memory, and
// deletes the resource instead of resuming, with and without the ID the
// lost Create would have recorded: the overlay and seed a Create cut short
// left without a domain are found by name, reported while they remain,
// and removed; only the shared base image stays.
func TestDelete_afterACrashAtEveryCreateStepLeavesNothing(t *testing.T) {
	refEnv := newTestEnv(t)
	warm(t, refEnv)
	before := refEnv.host.ncallsNow()
	createAndBoot(t, refEnv, "web", "uid-1")
	n := refEnv.host.ncallsNow() - before
	sawLeftovers := false
	for k := 1; k <= n; k++ {
		for _, withID := range []bool{true, false} {
			e := newTestEnv(t)
			warm(t, e)
			e.host.setCrashAt(e.host.ncallsNow() + k)
			req := e.request("web", "uid-1")
			_, _ = e.observeOrCreate(req)
			e.waitBackgroundDone()
			where := fmt.Sprintf("crash at call %d of %d (%s), ID recorded %t", k, n, e.host.callAt(before+k), withID)
			e.crash()
			e.host.setCrashAt(0)
			r := proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement}
			if withID {
				r.ID = formatID("lab", req.Name)
			}
			onlyVolumes := len(e.host.domainNames()) == 0 && slices.ContainsFunc(e.host.volNames(), func(v string) bool { return strings.HasPrefix(v, "web") })
			first := e.deleteAsTheController(r)
			if onlyVolumes {
				sawLeftovers = true
				if first.State != proxy.StateStopped || !strings.Contains(first.Progress, "remain in pool default") {
					t.Errorf("%s: Get of the deleted resource with only volumes left = %+v; want Stopped naming them", where, first)
				}
			}
			if got := e.host.domainNames(); len(got) != 0 {
				t.Errorf("%s: domains left: %v", where, got)
			}
			base := imageOf(e).volume()
			if diff := cmp.Diff([]string{base, base + ".sha256"}, e.host.volNames()); diff != "" {
				t.Errorf("%s: volumes after the deletion (-want +got):\n%s", where, diff)
			}
		}
	}
	if !sawLeftovers {
		t.Error("no crash point left volumes without a domain: the test proves nothing")
	}
}

// TestDelete_ofADomainThatNeverStarts: a domain whose start keeps failing
// (the host's bridge is gone) is deleted with its resource: a Get of the
// resource being deleted does not try to start it, so its error does not
// hold the deletion, and nothing is left.
func TestDelete_ofADomainThatNeverStarts(t *testing.T) {
	e := newTestEnv(t)
	warm(t, e)
	noBridge := lverr(libvirt.ErrSystemError, "Cannot get interface MTU on 'br0': No such device")
	e.host.mu.Lock()
	e.host.failNext["DomainCreate"] = []error{noBridge, noBridge, noBridge, noBridge, noBridge, noBridge, noBridge, noBridge}
	e.host.mu.Unlock()
	req := e.request("web", "uid-1")
	if _, err := e.observeOrCreate(req); err == nil || !strings.Contains(err.Error(), "No such device") {
		t.Fatalf("Create with the start failing = %v; want its error", err)
	}
	e.waitBackgroundDone()
	if diff := cmp.Diff([]string{"web"}, e.host.domainNames()); diff != "" {
		t.Fatalf("domains after the failed start (-want +got):\n%s", diff)
	}
	e.deleteAsTheController(proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement})
	base := imageOf(e).volume()
	got := struct{ Domains, Volumes []string }{e.host.domainNames(), e.host.volNames()}
	want := struct{ Domains, Volumes []string }{nil, []string{base, base + ".sha256"}}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("after the deletion (-want +got):\n%s", diff)
	}
}
