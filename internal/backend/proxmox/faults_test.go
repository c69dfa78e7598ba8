package proxmox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// The fault-injection suite of the Proxmox backend (docs/troubleshooting.md
// has its table). Cut connections at every write are
// TestCrashAndResumeAtEveryStep; locks, hibernation and running tasks are
// TestLocksSayWhatToDo; failed tasks TestFailedTasksReportExitStatusAndLog.

// TestFaults_table injects each fault into a proxy's creation, checks the
// class (and the backend's Retry-After) it reads as, clears it, and
// checks that the proxy then comes up on one VM with one seed, and that
// its deletion leaves nothing.
func TestFaults_table(t *testing.T) {
	every := func(pvetest.Request) bool { return true }
	cases := []struct {
		name       string
		inject     func(f *fixture)
		class      proxy.Class
		text       string
		retryAfter time.Duration
	}{
		{"StormOf596", func(f *fixture) { f.fake.SetBusy(true) }, proxy.ClassTransient, "596", 0},
		{"StormOf503WithRetryAfter", func(f *fixture) {
			f.fake.Inject(pvetest.Fault{Match: every, Status: 503, Message: "Service Unavailable", Times: -1, RetryAfter: "30"})
		}, proxy.ClassTransient, "503", 30 * time.Second},
		{"StormOf429WithRetryAfter", func(f *fixture) {
			f.fake.Inject(pvetest.Fault{Match: every, Status: 429, Message: "Too Many Requests", Times: -1, RetryAfter: "60"})
		}, proxy.ClassTransient, "429", time.Minute},
		{"VMIDRangeFull", func(f *fixture) {
			for id := 100000; id <= 100003; id++ {
				f.fake.AddVM(pvetest.VMSpec{VMID: id, Node: "pve1", Name: "someone-else"})
			}
		}, proxy.ClassQuota, "no free VMID", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, withConfig(func(c *proxmox.Config) { c.VMIDMin, c.VMIDMax = 100000, 100003 }))
			ctx := context.Background()
			r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-faults", "5e6f7a8b-0001-4a5e-9d55-0a9c1f1e2b3c")}
			tc.inject(f)
			var seen error
			for range 3 {
				if _, err := r.reconcile(ctx); err != nil {
					seen = err
					break
				}
				f.fake.FinishTasks()
			}
			if seen == nil || proxy.ClassOf(seen) != tc.class || !strings.Contains(seen.Error(), tc.text) || !strings.Contains(seen.Error(), testProvider) {
				t.Fatalf("under the fault: %s %v; want %s naming %q and the provider", proxy.ClassOf(seen), seen, tc.class, tc.text)
			}
			if got := proxy.RetryAfterOf(seen); got != tc.retryAfter {
				t.Errorf("under the fault: Retry-After read as %v; want %v", got, tc.retryAfter)
			}
			f.fake.SetBusy(false)
			f.fake.ClearFaults()
			for _, vm := range f.fake.VMs() {
				if vm.Name == "someone-else" {
					f.fake.Remove(vm.VMID)
				}
			}
			r.converge(ctx, 30)
			vm := vmNamed(t, f.fake, r.req.Name)
			if !strings.Contains(vm.Tags, proxmox.TagUIDPrefix+r.req.Mark.UID) {
				t.Errorf("VM %d carries tags %q; want the resource's mark", vm.VMID, vm.Tags)
			}
			if got := len(f.fake.Volumes()); got != 1 {
				t.Errorf("%d seed files; want 1", got)
			}
			r.deleteAll(ctx, 30)
		})
	}
}

// TestFaults_deletedWhileItsCloneRuns: a resource deleted while its clone
// holds the reserved VMID, after a restart that lost both the driver's
// memory of the clone and the resource's status, waits for the clone
// (Transient, saying so) and then removes the VM: nothing is left.
func TestFaults_deletedWhileItsCloneRuns(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	req := f.request("pt-reserved", "5e6f7a8b-0002-4a5e-9d55-0a9c1f1e2b3c")
	if _, err := f.drv.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	r := &reconciler{t: t, f: f, drv: f.newDriver(), req: req, deleted: true}
	got, err := r.drv.Get(ctx, r.ref())
	if err != nil || got.State != proxy.StateProvisioning {
		t.Fatalf("Get of the deleted resource while its clone runs = %+v, %v; want Provisioning (never NotFound)", got, err)
	}
	wantErr(t, "Delete while the clone runs", r.drv.Delete(ctx, r.ref()), proxy.ClassTransient, "still being cloned")
	r.converge(ctx, 30)
	assertNothingLeft(t, f.fake)
}
