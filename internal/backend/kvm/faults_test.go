package kvm

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// The fault-injection suite of the KVM backend on its seam fake
// (docs/troubleshooting.md has its table). A crash at every Create step is
// TestCreate_resumesAfterCrashAtEveryStep (resumed) and
// TestDelete_afterACrashAtEveryCreateStepLeavesNothing (deleted instead).

// TestFaults_table injects each fault into a proxy's creation, checks the
// class it reads as (from Create, or from the Get after it for what
// happens in the background), clears it, and checks that the proxy then
// comes up with one domain, one overlay and one seed, and that its
// deletion leaves only the shared base image.
func TestFaults_table(t *testing.T) {
	cases := []struct {
		name   string
		inject func(e *testEnv)
		clear  func(e *testEnv)
		class  proxy.Class
		text   string
	}{
		{"HostBusy", func(e *testEnv) { e.host.busy = true }, func(e *testEnv) { e.host.busy = false },
			proxy.ClassTransient, "cannot acquire state change lock"},
		{"ConnectionCutInTheMiddleOfACall", func(e *testEnv) {
			// The connection dies while the overlay is being created: the
			// call fails, and the link is closed as SSH's keepalive or
			// libvirt's disconnect close it.
			e.host.failNext["StorageVolCreateXML"] = []error{io.ErrUnexpectedEOF}
			e.host.onCall = map[string]func(){"StorageVolCreateXML": func() {
				e.b.pool.mu.Lock()
				defer e.b.pool.mu.Unlock()
				for _, c := range e.b.pool.conns {
					go c.link.close("connection cut")
				}
			}}
		}, func(e *testEnv) { e.host.onCall = nil }, proxy.ClassTransient, "unexpected EOF"},
		{"DialRefused", func(e *testEnv) { e.dialErr = io.EOF }, func(e *testEnv) { e.dialErr = nil },
			proxy.ClassTransient, "EOF"},
		{"ImageServerStormOf503", func(e *testEnv) { e.images.status = 503 }, func(e *testEnv) { e.images.status = 0 },
			proxy.ClassTransient, "503"},
		{"ImageServerStormOf429", func(e *testEnv) { e.images.status = 429 }, func(e *testEnv) { e.images.status = 0 },
			proxy.ClassTransient, "429"},
		{"PoolFull", func(e *testEnv) { e.host.pools["default"].available = 5 << 30 }, func(e *testEnv) { e.host.pools["default"].available = 80 << 30 },
			proxy.ClassQuota, "storage pool default on host lab has 5120 MiB available"},
		{"HostMemory", func(e *testEnv) { e.host.memAvailable = 256 << 20 }, func(e *testEnv) { e.host.memAvailable = 0 },
			proxy.ClassQuota, "host lab has 256 MiB of memory available"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			e.host.mu.Lock()
			tc.inject(e)
			e.host.mu.Unlock()
			req := e.request("web", "uid-1")
			err := e.reconcileSettled(req)
			if proxy.ClassOf(err) != tc.class || !strings.Contains(err.Error(), tc.text) || !strings.Contains(err.Error(), testProvider) {
				t.Fatalf("under the fault: %s %v; want %s naming %q and the provider", proxy.ClassOf(err), err, tc.class, tc.text)
			}
			e.host.mu.Lock()
			tc.clear(e)
			e.host.mu.Unlock()
			// A failed download is reported to Creates for a while rather
			// than retried at once; the fault has cleared, so forget it.
			e.b.images.mu.Lock()
			e.b.images.failedTTL = 0
			e.b.images.mu.Unlock()
			dials := e.dials.Load()
			inst := createAndBoot(t, e, "web", "uid-1")
			if tc.name == "ConnectionCutInTheMiddleOfACall" && e.dials.Load() == dials {
				t.Error("no new connection was dialled after the cut")
			}
			if diff := cmp.Diff([]string{"web"}, e.host.domainNames()); diff != "" {
				t.Errorf("domains (-want +got):\n%s", diff)
			}
			base := imageOf(e).volume()
			want := []string{base, base + ".sha256", "web-seed.iso", "web.qcow2"}
			slices.Sort(want)
			if diff := cmp.Diff(want, e.host.volNames()); diff != "" {
				t.Errorf("volumes (-want +got):\n%s", diff)
			}
			e.deleteAsTheController(ref(inst))
			if diff := cmp.Diff([]string{base, base + ".sha256"}, e.host.volNames()); diff != "" {
				t.Errorf("volumes after the deletion (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFaults_hostGoneWhileDeleting: a resource whose host answers nothing
// (the provider cannot reach it) keeps its deletion retrying, Transient,
// and finishes once the host is back: nothing is left.
func TestFaults_hostGoneWhileDeleting(t *testing.T) {
	e := newTestEnv(t)
	inst := createAndBoot(t, e, "web", "uid-1")
	r := ref(inst)
	r.Deleting, r.Live = true, true
	e.crash() // the pooled connection goes; the next call dials
	e.dialErr = io.EOF
	if _, err := e.d.Get(context.Background(), r); !proxy.IsTransient(err) {
		t.Fatalf("Get of the deleted resource on an unreachable host = %s %v; want Transient", proxy.ClassOf(err), err)
	}
	if err := e.d.Delete(context.Background(), r); !proxy.IsTransient(err) {
		t.Fatalf("Delete on an unreachable host = %s %v; want Transient", proxy.ClassOf(err), err)
	}
	e.dialErr = nil
	e.deleteAsTheController(r)
	if got := e.host.domainNames(); len(got) != 0 {
		t.Errorf("domains left: %v", got)
	}
	if got := slices.DeleteFunc(e.host.volNames(), func(v string) bool { return strings.HasPrefix(v, basePrefix) }); len(got) != 0 {
		t.Errorf("volumes left: %v", got)
	}
}
