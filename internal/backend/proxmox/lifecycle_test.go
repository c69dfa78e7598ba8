package proxmox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// reconciler drives one resource as the managed reconciler does, with a
// status that may be lost: Observe (Get), then Create when it is missing,
// Update when its spec differs, Delete when it is being deleted.
type reconciler struct {
	t       testing.TB
	f       *fixture
	drv     proxy.Driver
	req     proxy.Request
	status  proxy.Instance // what status.atProvider would hold
	deleted bool
}

// reconcile runs one reconcile and reports whether the resource reached
// its goal (Running with a reachable proxy and the request's spec, or
// gone when deleted).
func (r *reconciler) reconcile(ctx context.Context) (bool, error) {
	return proxytest.Reconcile(ctx, r.drv, r.ref(), r.req, &r.status, r.deleted)
}

// converge reconciles until the goal, ending the fake's tasks between
// reconciles; it fails the test after max rounds.
func (r *reconciler) converge(ctx context.Context, rounds int) []string {
	r.t.Helper()
	var errs []string
	for range rounds {
		done, err := r.reconcile(ctx)
		if err != nil {
			errs = append(errs, err.Error())
		}
		if done {
			return errs
		}
		r.f.fake.FinishTasks()
	}
	r.t.Fatalf("%s did not converge in %d reconciles; errors: %s", r.req.Name, rounds, strings.Join(errs, "\n  "))
	return errs
}

// endpoints summarises a request log as "METHOD /path" counts.
func endpoints(reqs []pvetest.Request) map[string]int {
	out := map[string]int{}
	for _, r := range reqs {
		out[r.Endpoint]++
	}
	return out
}

// TestLifecycleRequests walks a proxy from nothing to Ready and back to
// nothing through the reconcile loop, and pins the API requests each
// phase makes: in particular an Observe at steady state is one
// /cluster/resources and no guest-agent call (the address comes from the
// VM's last steady Get: batch.go).
func TestLifecycleRequests(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("payments-egress", "7d0c1a52-4a5e-4f7e-8d55-0a9c1f1e2b3c")}

	r.converge(ctx, 20)
	create := f.fake.Requests()
	t.Logf("create to Ready: %d requests: %v", len(create), endpoints(create))

	f.fake.ResetRequests()
	const polls = 5
	for range polls {
		inst, err := f.drv.Get(ctx, proxy.Ref{ID: r.status.ID, Name: r.req.Name, Mark: r.req.Mark, Placement: r.req.Placement})
		if err != nil || inst.State != proxy.StateRunning || !inst.ProxyReachable || inst.SpecHash != proxy.Hash(r.req) {
			t.Fatalf("steady-state Get = %+v, %v; want Running, reachable, up to date", inst, err)
		}
	}
	steady := f.fake.Requests()
	// A steady VM is read from the /cluster/resources snapshot with the
	// address its agent gave before (batch.go); every poll of one VM needs
	// a newer snapshot than its previous poll saw, so one list each.
	want := map[string]int{"GET /cluster/resources": polls}
	if diff := cmp.Diff(want, endpoints(steady)); diff != "" {
		t.Errorf("requests of %d steady-state Observes (-want +got):\n%s", polls, diff)
	}
	t.Logf("steady state: %.1f requests per Observe", float64(len(steady))/polls)

	f.fake.ResetRequests()
	r.deleted = true
	r.converge(ctx, 20)
	del := f.fake.Requests()
	t.Logf("delete to gone: %d requests: %v", len(del), endpoints(del))
	t.Logf("whole lifecycle: %d requests (%d create, %d per steady Observe, %d delete)", len(create)+len(del), len(create), len(steady)/polls, len(del))
	assertNothingLeft(t, f.fake)
}

// assertNothingLeft checks that only the templates and no files remain.
// deleteAll deletes the resource, reconciles until it is gone (at most
// rounds) and asserts that nothing of it is left on the fake.
func (r *reconciler) deleteAll(ctx context.Context, rounds int) {
	r.t.Helper()
	r.deleted = true
	r.converge(ctx, rounds)
	assertNothingLeft(r.t, r.f.fake)
}

func assertNothingLeft(t testing.TB, fake *pvetest.Server) {
	t.Helper()
	for _, vm := range fake.VMs() {
		if !vm.Template() {
			t.Errorf("VM %d (%s) is left on node %s", vm.VMID, vm.Name, vm.Node)
		}
	}
	for _, v := range fake.Volumes() {
		t.Errorf("volume %s is left (node %q)", v.VolID, v.Node)
	}
}

// TestCreateNeverWaits: every Create and Update returns while its task is
// still running (every task is held), and each starts at most one task.
func TestCreateNeverWaits(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	req := f.request("pt-nowait", "3f0e5a1c-1111-4a5e-9d55-0a9c1f1e2b3c")
	start := time.Now()
	inst, err := f.drv.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if inst.State != proxy.StateProvisioning || inst.Operation == "" {
		t.Errorf("Create = %+v; want Provisioning with the clone's UPID", inst)
	}
	if len(f.fake.PendingTasks()) != 1 {
		t.Errorf("running tasks after Create: %v; want the clone", f.fake.PendingTasks())
	}
	ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement}
	// While the clone runs, Update waits for it without starting anything.
	f.fake.ResetRequests()
	if _, err := f.drv.Update(ctx, ref, req); err != nil {
		t.Fatal(err)
	}
	for _, r := range f.fake.Requests() {
		if r.Method != "GET" {
			t.Errorf("Update during the clone sent %s %s", r.Method, r.Path)
		}
	}
	var steps []string
	for range 10 {
		f.fake.FinishTasks()
		before := len(f.fake.Requests())
		u, err := f.drv.Update(ctx, ref, req)
		if err != nil {
			t.Fatal(err)
		}
		var writes []string
		for _, r := range f.fake.Requests()[before:] {
			if r.Method != "GET" {
				writes = append(writes, r.Method+" "+r.Endpoint[strings.Index(r.Endpoint, " ")+1:])
			}
		}
		steps = append(steps, strings.Join(writes, " + "))
		if u.SpecHash == proxy.Hash(req) {
			break
		}
	}
	want := []string{
		"POST /nodes/{node}/storage/{storage}/upload + PUT /nodes/{node}/qemu/{vmid}/config",
		"PUT /nodes/{node}/qemu/{vmid}/resize",
		"POST /nodes/{node}/qemu/{vmid}/status/start",
		"PUT /nodes/{node}/qemu/{vmid}/config",
	}
	if diff := cmp.Diff(want, steps); diff != "" {
		t.Errorf("writes of each Update after the clone (-want +got):\n%s", diff)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the whole sequence took %v with every task held: something waited", took)
	}
}

// TestSeedInstallsSquid: the seed the VM boots from is a NoCloud seed
// whose user-data installs Squid with the rendered config, the guest agent
// and the user's cloud-init; without installGuestAgent the agent is not
// installed (and a template without it never reports an address).
func TestSeedInstallsSquid(t *testing.T) {
	for _, agent := range []bool{true, false} {
		t.Run(fmt.Sprintf("installGuestAgent=%v", agent), func(t *testing.T) {
			f := newFixture(t, withConfig(func(c *proxmox.Config) { c.InstallGuestAgent = agent }))
			ctx := context.Background()
			req := f.request("pt-seed", "5a6b7c8d-2222-4a5e-9d55-0a9c1f1e2b3c")
			req.CloudInit = "#cloud-config\ntimezone: Europe/Prague\n"
			r := &reconciler{t: t, f: f, drv: f.drv, req: req}
			if agent {
				r.converge(ctx, 20)
			} else {
				for range 8 {
					_, _ = r.reconcile(ctx)
					f.fake.FinishTasks()
				}
				if r.status.State != proxy.StateProvisioning || !strings.Contains(r.status.Progress, "guest agent") {
					t.Errorf("without the agent: %s %q; want Provisioning, waiting for the guest agent", r.status.State, r.status.Progress)
				}
			}
			vm := vmNamed(t, f.fake, req.Name)
			if vm.Seed.Label != "cidata" {
				t.Errorf("seed label %q; want cidata", vm.Seed.Label)
			}
			for _, want := range []string{"squid", "timezone: Europe/Prague", "write_files"} {
				if !strings.Contains(vm.Seed.UserData, want) {
					t.Errorf("user-data lacks %q", want)
				}
			}
			if got := strings.Contains(vm.Seed.UserData, "qemu-guest-agent"); got != agent {
				t.Errorf("user-data installs qemu-guest-agent: %v; want %v", got, agent)
			}
			if !strings.Contains(vm.Seed.MetaData, `instance-id: "egressproxy-`) {
				t.Errorf("meta-data %q has no instance-id of the provider", vm.Seed.MetaData)
			}
			for k, want := range map[string]string{"cores": "1", "memory": "1024", "agent": "1", "onboot": "1"} {
				if vm.Config[k] != want {
					t.Errorf("config %s = %q; want %q", k, vm.Config[k], want)
				}
			}
			if !strings.Contains(vm.Config["net0"], "bridge=vmbr0") || !strings.Contains(vm.Config["net0"], "tag=20") {
				t.Errorf("net0 = %q; want bridge vmbr0 and VLAN 20", vm.Config["net0"])
			}
			if !strings.Contains(vm.Config["scsi0"], "size=10G") {
				t.Errorf("scsi0 = %q; want grown to 10G", vm.Config["scsi0"])
			}
		})
	}
}

func vmNamed(t testing.TB, fake *pvetest.Server, name string) pvetest.VM {
	t.Helper()
	var out []pvetest.VM
	for _, vm := range fake.VMs() {
		if vm.Name == name {
			out = append(out, vm)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d VMs named %s; want 1", len(out), name)
	}
	return out[0]
}

// TestUpdateAppliesSettingsByReboot: changed proxy settings reach the VM
// as a new seed with a new instance ID and one reboot, after which the
// spec tag names the new request.
func TestUpdateAppliesSettingsByReboot(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-update", "6b7c8d9e-3333-4a5e-9d55-0a9c1f1e2b3c")}
	r.converge(ctx, 20)
	before := vmNamed(t, f.fake, r.req.Name)

	r.req.Proxy.AllowedClientCIDRs = []string{"192.0.2.0/24"}
	r.converge(ctx, 20)
	after := vmNamed(t, f.fake, r.req.Name)
	if after.Boots != before.Boots+1 {
		t.Errorf("boots %d -> %d; want one reboot", before.Boots, after.Boots)
	}
	if after.Seed.MetaData == before.Seed.MetaData {
		t.Errorf("meta-data unchanged (%q): cloud-init would not run again", after.Seed.MetaData)
	}
	if !strings.Contains(after.Tags, proxmox.TagSpecPrefix+proxy.Hash(r.req)) {
		t.Errorf("tags %q lack the new spec hash", after.Tags)
	}
	if strings.Contains(after.Description, "egressproxy-applying") {
		t.Errorf("description still records the update: %q", after.Description)
	}
}

// TestUpdateOfAStoppedVMWaitsForItsSeed: a stopped VM takes changed
// settings from the seed it reads at its next boot, so the spec tag names
// the new request only once that seed is on storage. An upload that
// failed is retried; the tag never claims settings the VM would not get.
func TestUpdateOfAStoppedVMWaitsForItsSeed(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-stopped", "6b7c8d9e-4444-4a5e-9d55-0a9c1f1e2b3c")}
	r.converge(ctx, 20)
	if err := f.fake.PowerOff(vmidOf(t, r.status.ID)); err != nil {
		t.Fatal(err)
	}
	// Seeds are dated in seconds: the new one must not share the old one's.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))

	r.req.Proxy.AllowedClientCIDRs = []string{"192.0.2.0/24"}
	f.fake.FailNextTask("imgcopy", "command 'cp' failed: No space left on device")
	seedHolds := func() bool {
		for _, v := range f.fake.Volumes() {
			if strings.Contains(v.VolID, r.req.Name) && strings.Contains(cloudinit.SquidConfOf(v.Seed.UserData), "192.0.2.0/24") {
				return true
			}
		}
		return false
	}
	for i := range 8 {
		if i == 4 {
			// Past RetryFailedTaskAfter: the upload that never landed is redone.
			f.advance(2 * time.Minute)
		}
		_, _ = r.reconcile(ctx)
		f.fake.FinishTasks()
		vm := vmNamed(t, f.fake, r.req.Name)
		if tagged := strings.Contains(vm.Tags, proxmox.TagSpecPrefix+proxy.Hash(r.req)); tagged && !seedHolds() {
			t.Fatalf("round %d: tags %q name the new settings, but the seed on storage does not hold them", i, vm.Tags)
		}
	}
	vm := vmNamed(t, f.fake, r.req.Name)
	got := struct {
		Tagged, Seeded bool
		Status         string
	}{strings.Contains(vm.Tags, proxmox.TagSpecPrefix+proxy.Hash(r.req)), seedHolds(), vm.Status}
	want := struct {
		Tagged, Seeded bool
		Status         string
	}{true, true, "stopped"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the stopped VM after the update (-want +got):\n%s", diff)
	}
}

// TestSpecChangedWhileProvisioningReachesTheGuest: settings changed while
// the VM is still being provisioned (its seed already uploaded, or the VM
// already started with it) reach the guest: the spec tag never names
// settings the guest did not boot with.
func TestSpecChangedWhileProvisioningReachesTheGuest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rounds int
		status string
	}{
		{name: "seed uploaded, not started", rounds: 2, status: "stopped"},
		{name: "started, not complete", rounds: 4, status: "running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-midway", "6b7c8d9e-5555-4a5e-9d55-0a9c1f1e2b3c")}
			for range tc.rounds {
				_, _ = r.reconcile(ctx)
				f.fake.FinishTasks()
			}
			if v := vmNamed(t, f.fake, r.req.Name); !strings.Contains(v.Config["ide2"], "egressproxy-") || v.Status != tc.status || strings.Contains(v.Tags, proxmox.TagSpecPrefix) {
				t.Fatalf("after %d rounds: status %s, ide2 %q, tags %q; want %s, its seed attached, no spec tag", tc.rounds, v.Status, v.Config["ide2"], v.Tags, tc.status)
			}
			r.req.Proxy.AllowedClientCIDRs = []string{"192.0.2.0/24"}
			r.converge(ctx, 20)
			vm := vmNamed(t, f.fake, r.req.Name)
			got := struct{ Tagged, Booted bool }{strings.Contains(vm.Tags, proxmox.TagSpecPrefix+proxy.Hash(r.req)), strings.Contains(cloudinit.SquidConfOf(vm.Seed.UserData), "192.0.2.0/24")}
			if diff := cmp.Diff(struct{ Tagged, Booted bool }{true, true}, got); diff != "" {
				t.Errorf("settings changed mid-provisioning (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPortChangedBeforeTheFirstStartIsRecorded: a port changed after the
// seed's upload and before the first start goes into the seed uploaded
// again, and the VM records the port its guest booted with even when the
// settings change again before provisioning completes: the probe and the
// proxy's address use it until the update that follows.
func TestPortChangedBeforeTheFirstStartIsRecorded(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-port", "6b7c8d9e-6666-4a5e-9d55-0a9c1f1e2b3c")}
	for range 2 {
		_, _ = r.reconcile(ctx)
		f.fake.FinishTasks()
	}
	if v := vmNamed(t, f.fake, r.req.Name); v.Status != "stopped" {
		t.Fatalf("after the seed's upload: status %s; want stopped", v.Status)
	}
	r.req.Proxy.Port = 8080
	for i := 0; vmNamed(t, f.fake, r.req.Name).Status != "running"; i++ {
		if i == 10 {
			t.Fatal("the VM did not start")
		}
		_, _ = r.reconcile(ctx)
		f.fake.FinishTasks()
	}
	r.req.Proxy.AllowedClientCIDRs = []string{"192.0.2.0/24"}
	_, _ = r.reconcile(ctx)
	vm := vmNamed(t, f.fake, r.req.Name)
	got := struct{ Booted, Recorded bool }{
		strings.Contains(cloudinit.SquidConfOf(vm.Seed.UserData), "http_port 8080"),
		strings.Contains(vm.Description, "egressproxy-port: 8080"),
	}
	if diff := cmp.Diff(struct{ Booted, Recorded bool }{true, true}, got); diff != "" {
		t.Errorf("port changed before the first start (-want +got):\n%s\ndescription:\n%s", diff, vm.Description)
	}
}
