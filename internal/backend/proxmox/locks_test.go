package proxmox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// ready brings a proxy to Ready and returns its reconciler.
func ready(t *testing.T, f *fixture, name, uid string) *reconciler {
	t.Helper()
	r := &reconciler{t: t, f: f, drv: f.drv, req: f.request(name, uid)}
	r.converge(context.Background(), 20)
	return r
}

func (r *reconciler) ref() proxy.Ref {
	return proxy.Ref{ID: r.status.ID, Name: r.req.Name, Mark: r.req.Mark, Placement: r.req.Placement, Operation: r.status.Operation,
		Live: r.deleted, Deleting: r.deleted}
}

func wantErr(t *testing.T, what string, err error, class proxy.Class, texts ...string) {
	t.Helper()
	if proxy.ClassOf(err) != class {
		t.Errorf("%s = %v (%s); want %s", what, err, proxy.ClassOf(err), class)
		return
	}
	for _, s := range texts {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s = %q; want it to say %q", what, err, s)
		}
	}
}

// TestLocksSayWhatToDo: a config lock (a backup, a stale clone lock) or a
// hibernated VM never fails Get, and makes Update and Delete Transient
// with a message that says what the admin can do; once the admin acted,
// they go on by themselves.
func TestLocksSayWhatToDo(t *testing.T) {
	ctx := context.Background()
	t.Run("backup", func(t *testing.T) {
		f := newFixture(t)
		r := ready(t, f, "pt-backup", "4c5d6e7f-0001-4a5e-9d55-0a9c1f1e2b3c")
		vmid := vmidOf(t, r.status.ID)
		if err := f.fake.Lock(vmid, "backup"); err != nil {
			t.Fatal(err)
		}
		inst, err := f.drv.Get(ctx, r.ref())
		if err != nil || inst.State != proxy.StateRunning || !strings.Contains(inst.Progress, "locked (backup)") {
			t.Errorf("Get during a backup = %s %q, %v; want Running, saying it is locked", inst.State, inst.Progress, err)
		}
		changed := r.req
		changed.Proxy.AllowedDestinations = []string{".example.com"}
		_, err = f.drv.Update(ctx, r.ref(), changed)
		wantErr(t, "Update during a backup", err, proxy.ClassTransient, "locked (backup)", "qm unlock")
		wantErr(t, "Delete during a backup", f.drv.Delete(ctx, r.ref()), proxy.ClassTransient, "locked (backup)", "qm unlock")
		if err := f.fake.Lock(vmid, ""); err != nil {
			t.Fatal(err)
		}
		r.deleteAll(ctx, 20)
	})
	t.Run("stale clone lock", func(t *testing.T) {
		f := newFixture(t)
		r := ready(t, f, "pt-stale", "4c5d6e7f-0002-4a5e-9d55-0a9c1f1e2b3c")
		if err := f.fake.Lock(vmidOf(t, r.status.ID), "clone"); err != nil {
			t.Fatal(err)
		}
		inst, err := f.drv.Get(ctx, r.ref())
		if err != nil || inst.State != proxy.StateProvisioning || !strings.Contains(inst.Progress, "qm unlock") {
			t.Errorf("Get with a stale clone lock = %s %q, %v; want Provisioning, naming qm unlock", inst.State, inst.Progress, err)
		}
		wantErr(t, "Delete with a stale clone lock", f.drv.Delete(ctx, r.ref()), proxy.ClassTransient, "locked (clone)", "qm unlock")
	})
	t.Run("hibernated", func(t *testing.T) {
		f := newFixture(t)
		r := ready(t, f, "pt-hibernated", "4c5d6e7f-0003-4a5e-9d55-0a9c1f1e2b3c")
		vmid := vmidOf(t, r.status.ID)
		if err := f.fake.Hibernate(vmid); err != nil {
			t.Fatal(err)
		}
		inst, err := f.drv.Get(ctx, r.ref())
		if err != nil || inst.State != proxy.StateStopped || !strings.Contains(inst.Progress, "hibernated") || !strings.Contains(inst.Progress, "qm resume") {
			t.Errorf("Get of a hibernated VM = %s %q, %v; want Stopped, saying how to resume it", inst.State, inst.Progress, err)
		}
		wantErr(t, "Delete of a hibernated VM", f.drv.Delete(ctx, r.ref()), proxy.ClassTransient, "hibernated", "qm resume", "qm unlock")
		// Still so on the next attempt: it is not latched, it waits.
		wantErr(t, "Delete of a hibernated VM again", f.drv.Delete(ctx, r.ref()), proxy.ClassTransient, "hibernated")
		if err := f.fake.Resume(vmid); err != nil {
			t.Fatal(err)
		}
		r.deleteAll(ctx, 20)
	})
	t.Run("running task", func(t *testing.T) {
		f := newFixture(t)
		r := ready(t, f, "pt-task", "4c5d6e7f-0004-4a5e-9d55-0a9c1f1e2b3c")
		// A held stop (someone's, or our own earlier call): Delete waits
		// for it instead of piling a second task onto the VM.
		if err := r.drv.Delete(ctx, r.ref()); err != nil {
			t.Fatal(err)
		}
		before := len(f.fake.PendingTasks())
		for range 3 {
			if err := r.drv.Delete(ctx, r.ref()); err != nil {
				t.Fatal(err)
			}
		}
		if after := len(f.fake.PendingTasks()); after != before {
			t.Errorf("tasks while one runs: %d -> %d; want no new ones", before, after)
		}
	})
}

// TestFailedTasksReportExitStatusAndLog: a task that failed is reported
// with its exit status and the tail of its log, and its step is tried
// again once RetryFailedTaskAfter passed.
func TestFailedTasksReportExitStatusAndLog(t *testing.T) {
	ctx := context.Background()
	t.Run("clone", func(t *testing.T) {
		f := newFixture(t)
		req := f.request("pt-clonefail", "5d6e7f80-0001-4a5e-9d55-0a9c1f1e2b3c")
		f.fake.FailNextTask("qmclone", "clone failed: no space left on device")
		inst, err := f.drv.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		f.fake.FinishTasks()
		ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement, Operation: inst.Operation}
		_, err = f.drv.Get(ctx, ref)
		wantErr(t, "Get after a failed clone", err, proxy.ClassTransient, "no space left on device", "create full clone of drive scsi0", inst.Operation)
		f.advance(2 * time.Minute)
		if _, err := f.drv.Get(ctx, ref); !proxy.IsNotFound(err) {
			t.Errorf("Get once the failure is old = %v; want NotFound, so that Create clones again", err)
		}
		r := &reconciler{t: t, f: f, drv: f.drv, req: req}
		r.converge(ctx, 20)
	})
	t.Run("start", func(t *testing.T) {
		f := newFixture(t)
		r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-startfail", "5d6e7f80-0002-4a5e-9d55-0a9c1f1e2b3c")}
		f.fake.FailNextTask("qmstart", "start failed: QEMU exited with code 1",
			"kvm: -drive file=/dev/pve/vm-disk-0,if=none: Could not open '/dev/pve/vm-disk-0': Permission denied")
		var errs []string
		for range 12 {
			if _, err := r.reconcile(ctx); err != nil {
				errs = append(errs, err.Error())
			}
			f.fake.FinishTasks()
		}
		if len(errs) == 0 || !strings.Contains(errs[0], "QEMU exited with code 1") || !strings.Contains(errs[0], "starting VM") ||
			!strings.Contains(errs[0], "last lines of its log: kvm: -drive file=/dev/pve/vm-disk-0") {
			t.Fatalf("errors while the start failed: %q; want the task's exit status", errs)
		}
		if r.status.State == proxy.StateRunning {
			t.Errorf("started again before RetryFailedTaskAfter")
		}
		f.advance(2 * time.Minute)
		r.converge(ctx, 20)
	})
	t.Run("resize", func(t *testing.T) {
		f := newFixture(t)
		r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-resizefail", "5d6e7f80-0003-4a5e-9d55-0a9c1f1e2b3c")}
		f.fake.FailNextTask("qmresize", "disk resize failed: volume too large")
		var errs []string
		for range 8 {
			if _, err := r.reconcile(ctx); err != nil {
				errs = append(errs, err.Error())
			}
			f.fake.FinishTasks()
		}
		if len(errs) == 0 || !strings.Contains(errs[0], "volume too large") {
			t.Fatalf("errors while the resize failed: %q; want the task's exit status", errs)
		}
		f.advance(2 * time.Minute)
		r.converge(ctx, 20)
	})
	t.Run("stop", func(t *testing.T) {
		f := newFixture(t)
		r := ready(t, f, "pt-stopfail", "5d6e7f80-0004-4a5e-9d55-0a9c1f1e2b3c")
		f.fake.FailNextTask("qmstop", "VM quit/powerdown failed - got timeout")
		r.deleted = true
		var errs []string
		for range 6 {
			if _, err := r.reconcile(ctx); err != nil {
				errs = append(errs, err.Error())
			}
			f.fake.FinishTasks()
		}
		if len(errs) == 0 || !strings.Contains(errs[0], "got timeout") || !strings.Contains(errs[0], "stopping VM") {
			t.Fatalf("errors while the stop failed: %q; want the task's exit status", errs)
		}
		f.advance(2 * time.Minute)
		r.converge(ctx, 20)
		assertNothingLeft(t, f.fake)
	})
}
