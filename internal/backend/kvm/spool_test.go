package kvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// useSpool gives the process's spool budget limit bytes and a directory
// of the test's own for its files, until the test ends.
func useSpool(t *testing.T, limit int64) (dir string) {
	t.Helper()
	dir = t.TempDir()
	imageSpool.mu.Lock()
	oldLimit, oldDir, used := imageSpool.limit, imageSpool.dir, imageSpool.used
	imageSpool.limit, imageSpool.dir = limit, dir
	imageSpool.mu.Unlock()
	if used != 0 {
		t.Fatalf("the spool holds %d bytes before the test", used)
	}
	t.Cleanup(func() {
		imageSpool.mu.Lock()
		defer imageSpool.mu.Unlock()
		imageSpool.limit, imageSpool.dir = oldLimit, oldDir
	})
	return dir
}

// spoolInUse is what open spool files hold now.
func spoolInUse() int64 {
	_, used := imageSpool.budget()
	return used
}

// checkSpoolEmpty fails t unless every spool file in dir is gone: none
// left in the directory, none still open (an unlinked file keeps its disk
// space until closed), and nothing charged to the budget.
func checkSpoolEmpty(t *testing.T, dir string) {
	t.Helper()
	if n := spoolInUse(); n != 0 {
		t.Errorf("the spool budget still holds %d bytes", n)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("spool files left in %s: %v", dir, left)
	}
	if open := openSpoolFiles(t, dir); len(open) != 0 {
		t.Errorf("spool files still open: %v", open)
	}
}

// openSpoolFiles are the files in dir the process holds open, unlinked or
// not, as Linux's /proc/self/fd shows them.
func openSpoolFiles(t *testing.T, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("listing the open files: %v", err)
	}
	var open []string
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, dir+"/") {
			open = append(open, target)
		}
	}
	return open
}

// waitFailure reconciles r until its create's background work fails, and
// returns that failure.
func (e *testEnv) waitFailure(r proxy.Ref) error {
	e.t.Helper()
	var failed error
	testenv.WaitFor(e.t, "the create of "+r.Name+" to fail", 10*time.Second, func() (bool, string) {
		inst, err := e.d.Get(context.Background(), r)
		failed = err
		return err != nil, inst.Progress
	})
	return failed
}

// TestImage_spoolBudgetIsSharedByEveryDownload: two images without a
// Content-Length, of 3 and 4 MiB, under a 5 MiB spool budget. While the
// first is held half-way, the second runs out of spool space and fails
// Quota, naming why and what would do, and nothing of its URL's query. An
// image with a Content-Length larger than what is left downloads: it is
// never spooled. Once the first is in, the budget is free again and the
// second downloads. No spool file outlives its download.
func TestImage_spoolBudgetIsSharedByEveryDownload(t *testing.T) {
	const sig = "S3NT1NEL-signature-7d1f0b"
	dir := useSpool(t, 5<<20)
	big, sized := newImageServer(t, 4<<20), newImageServer(t, 6<<20)
	big.chunked = true
	e := newTestEnv(t, func(e *testEnv) {
		e.images.chunked = true
		e.cfg.Images["big"] = Image{URL: big.URL + "/big.qcow2?X-Amz-Signature=" + sig, SHA256: big.sha()}
		e.cfg.Images["sized"] = Image{URL: sized.URL + "/sized.qcow2", SHA256: sized.sha()}
	})
	e.b.images.failedTTL = 0 // the second image's retry downloads again
	release := e.images.holdBodies()
	defer release()

	e.mustCreate(e.request("a", "uid-a"))
	half := int64(len(e.images.content) / 2)
	testenv.WaitFor(t, "the first image's first half to be spooled", 5*time.Second, func() (bool, string) {
		return spoolInUse() == half, ""
	})

	reqB := e.request("b", "uid-b")
	reqB.Placement.Image = "big"
	err := e.waitFailure(ref(e.mustCreate(reqB)))
	var pe *proxy.Error
	if !proxy.IsQuota(err) || !errors.As(err, &pe) || pe.Reason != "SpoolFull" {
		t.Fatalf("Create of the second image = %v (%s); want Quota, reason SpoolFull", err, proxy.ClassOf(err))
	}
	for _, want := range []string{"image big: its server sends no Content-Length",
		"the provider's spool space for such images (5 MiB, shared by every config and host) is in use",
		"retry later, or serve the image with a Content-Length"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Create of the second image = %v; want it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), sig) || strings.Contains(e.logs.String(), sig) {
		t.Errorf("the URL's query leaks: %v", err)
	}
	if got, open := spoolInUse(), openSpoolFiles(t, dir); got != half || len(open) != 1 {
		t.Errorf("after the second image failed, the spool holds %d bytes in %v; want the first image's %d in one file", got, open, half)
	}

	reqC := e.request("c", "uid-c")
	reqC.Placement.Image = "sized"
	e.mustCreate(reqC)
	img, err := e.d.image("sized")
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the image with a Content-Length to download", 10*time.Second, func() (bool, string) {
		return slices.Contains(e.host.volNames(), img.marker()), strings.Join(e.host.volNames(), " ")
	})
	if got := spoolInUse(); got != half {
		t.Errorf("the image with a Content-Length changed the spool: %d bytes; want %d", got, half)
	}

	release()
	createAndBoot(t, e, "a", "uid-a")
	if n := spoolInUse(); n != 0 {
		t.Errorf("after the first image is in, the spool holds %d bytes; want 0", n)
	}
	createAndBootReq(t, e, reqB)
	if n := big.gets.Load(); n != 2 {
		t.Errorf("the second image was fetched %d times; want 2 (the failure, the retry)", n)
	}
	checkSpoolEmpty(t, dir)
}

// TestImage_largerThanTheSpoolIsPermanent: an image without a
// Content-Length that alone exceeds the spool budget fails Permanent
// (no retry brings it in), leaving nothing in the pool or the spool.
func TestImage_largerThanTheSpoolIsPermanent(t *testing.T) {
	dir := useSpool(t, 2<<20)
	e := newTestEnv(t, func(e *testEnv) { e.images.chunked = true })
	err := e.createError(e.request("web", "uid-1"))
	const want = "image debian: its server sends no Content-Length, and it is larger than the 2 MiB the provider spools for such images: serve it with a Content-Length"
	if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Create = %v (%s); want Permanent saying %q", err, proxy.ClassOf(err), want)
	}
	if got := e.host.volNames(); len(got) != 0 {
		t.Errorf("volumes written: %v", got)
	}
	checkSpoolEmpty(t, dir)
}

// TestImage_tenantImagesNeedAContentLength: a tenant's image, a
// namespaced config's catalogue entry or a proxy's image URL, whose server
// sends no Content-Length is refused Permanent before a byte is spooled:
// a tenant's server cannot hold the provider's disk or the spool budget
// every config shares. The error names neither the URL's query nor what
// the server sent.
func TestImage_tenantImagesNeedAContentLength(t *testing.T) {
	const sig = "S3NT1NEL-signature-0a4c2e"
	const want = "its server sends no Content-Length, and the image of a namespaced ProviderConfig or of a proxy's image URL is downloaded only with one: serve it with a Content-Length"
	guard := onlyAllowing(t, "127.0.0.0/8")
	for name, setup := range map[string]func(e *testEnv){
		"CatalogueImage": func(e *testEnv) {
			e.cfg.Guard = guard
			e.cfg.Images["debian"] = Image{URL: mirrorURL + "?X-Amz-Signature=" + sig}
		},
		"ProxyImageURL": func(e *testEnv) { e.cfg.URLGuard = guard },
	} {
		t.Run(name, func(t *testing.T) {
			dir := useSpool(t, DefaultMaxSpoolBytes)
			e := newTestEnv(t, setup, func(e *testEnv) { e.images.chunked = true })
			e.throughProxy(e.images.Listener.Addr().String())
			req := e.request("web", "uid-1")
			if name == "ProxyImageURL" {
				req.Placement.Image = mirrorURL + "?X-Amz-Signature=" + sig
			}
			err := e.createError(req)
			if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), want) {
				t.Fatalf("Create = %v (%s); want Permanent saying %q", err, proxy.ClassOf(err), want)
			}
			if strings.Contains(err.Error(), sig) || strings.Contains(e.logs.String(), sig) {
				t.Errorf("the URL's query leaks: %v", err)
			}
			if n := e.images.gets.Load(); n != 1 {
				t.Errorf("the image was fetched %d times; want 1", n)
			}
			if got := e.host.volNames(); len(got) != 0 {
				t.Errorf("volumes written: %v", got)
			}
			checkSpoolEmpty(t, dir)
		})
	}
}

// TestSpool_chargesWritesAndReleasesOnClose: a spool file is charged as
// it is written, refused past the budget (as busy while other files hold
// it, as too large when it alone would not fit), and releases its charge
// once, when closed.
func TestSpool_chargesWritesAndReleasesOnClose(t *testing.T) {
	s := &spool{limit: 10, dir: t.TempDir()}
	a, err := s.create()
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.create()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(make([]byte, 6)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write(make([]byte, 5)); !errors.Is(err, errSpoolBusy) {
		t.Errorf("writing 5 bytes with 6 of 10 spooled = %v; want %v", err, errSpoolBusy)
	}
	if _, err := a.Write(make([]byte, 5)); !errors.Is(err, errSpoolTooLarge) {
		t.Errorf("growing a 6-byte file by 5 under a 10-byte budget = %v; want %v", err, errSpoolTooLarge)
	}
	if _, err := b.Write(make([]byte, 4)); err != nil {
		t.Errorf("writing what fits: %v", err)
	}
	_ = a.Close()
	_ = a.Close()
	if _, used := s.budget(); used != 4 {
		t.Errorf("after closing the 6-byte file (twice), %d bytes are charged; want 4", used)
	}
	_ = b.Close()
	if _, used := s.budget(); used != 0 {
		t.Errorf("after closing every file, %d bytes are charged; want 0", used)
	}
}

// TestSetMaxSpoolBytes: 0 restores the default, a negative value spools
// nothing.
func TestSetMaxSpoolBytes(t *testing.T) {
	useSpool(t, 1)
	for _, tc := range []struct{ set, want int64 }{{0, DefaultMaxSpoolBytes}, {-1, 0}, {1 << 20, 1 << 20}} {
		SetMaxSpoolBytes(tc.set)
		if got, _ := imageSpool.budget(); got != tc.want {
			t.Errorf("SetMaxSpoolBytes(%d): the budget is %d; want %d", tc.set, got, tc.want)
		}
	}
}
