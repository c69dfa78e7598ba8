package proxmox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// lifecycle runs a resource from nothing to Ready and back to nothing,
// with a new driver (a restarted provider) and a lost status for every
// reconcile when amnesiac is set, and returns the errors reconciles met.
func lifecycle(t *testing.T, f *fixture, req proxy.Request, amnesiac bool) []string {
	t.Helper()
	ctx := context.Background()
	r := &reconciler{t: t, f: f, drv: f.drv, req: req}
	var errs []string
	run := func(phase string) {
		for range 30 {
			if amnesiac {
				r.drv, r.status = f.newDriver(), proxy.Instance{}
			}
			done, err := r.reconcile(ctx)
			if err != nil {
				errs = append(errs, err.Error())
			}
			if done {
				return
			}
			f.fake.FinishTasks()
		}
		t.Fatalf("%s did not finish; errors: %s", phase, strings.Join(errs, "\n  "))
	}
	run("create")
	vm := vmNamed(t, f.fake, req.Name)
	if !strings.Contains(vm.Tags, proxmox.TagSpecPrefix+proxy.Hash(req)) || vm.Status != "running" {
		t.Errorf("after create: VM %d %s, tags %q; want running and complete", vm.VMID, vm.Status, vm.Tags)
	}
	if seeds := f.fake.Volumes(); len(seeds) != 1 {
		t.Errorf("after create: %d files on storage, want the one seed: %+v", len(seeds), seeds)
	}
	r.deleted = true
	run("delete")
	assertNothingLeft(t, f.fake)
	return errs
}

// TestCrashAndResumeAtEveryStep cuts the connection at each write of a
// proxy's life, once after the server acted on it (the provider crashed
// or lost the answer) and once before, and resumes every reconcile with a
// new driver and no status (a restarted provider that lost its status):
// the proxy still ends Ready with one VM and one seed, and then leaves
// nothing behind.
func TestCrashAndResumeAtEveryStep(t *testing.T) {
	golden := newFixture(t)
	req := golden.request("pt-resume", "8c9d0e1f-4444-4a5e-9d55-0a9c1f1e2b3c")
	lifecycle(t, golden, req, false)
	var writes []string
	for _, r := range golden.fake.Requests() {
		if r.Method != "GET" {
			writes = append(writes, r.Endpoint)
		}
	}
	if len(writes) < 9 {
		t.Fatalf("the golden run made %d writes: %v", len(writes), writes)
	}
	for i, w := range writes {
		for _, after := range []bool{true, false} {
			when := "before"
			if after {
				when = "after"
			}
			short := w[strings.LastIndex(w, "/")+1:]
			t.Run(fmt.Sprintf("%02d-%s-%s-%s", i+1, strings.Fields(w)[0], short, when), func(t *testing.T) {
				t.Parallel()
				f := newFixture(t)
				n := 0
				f.fake.Inject(pvetest.Fault{Drop: true, After: after, Match: func(r pvetest.Request) bool {
					if r.Method == "GET" {
						return false
					}
					n++
					return n == i+1
				}})
				errs := lifecycle(t, f, req, true)
				if len(errs) == 0 {
					t.Errorf("no reconcile saw the cut connection at %s", w)
				}
				for _, e := range errs {
					if !strings.Contains(e, testProvider) {
						t.Errorf("error without the provider's name: %s", e)
					}
				}
			})
		}
	}
}

// TestConcurrentCreatesNeverCollide starts 20 proxies at once, each from
// its own driver (as if from 20 provider processes), in a VMID range
// barely larger than 20 so that their probe windows overlap: every proxy
// ends on its own VMID, carrying its own mark, and nothing is duplicated.
func TestConcurrentCreatesNeverCollide(t *testing.T) {
	f := newFixture(t, withFake(func(o *pvetest.Options) { o.Durations = pvetest.FastDurations }),
		withConfig(func(c *proxmox.Config) { c.VMIDMin, c.VMIDMax = 100000, 100024 }))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 20
	var wg sync.WaitGroup
	errs := make([]error, n)
	reqs := make([]proxy.Request, n)
	for i := range n {
		reqs[i] = f.request(fmt.Sprintf("pt-concurrent-%02d", i), fmt.Sprintf("9d0e1f2a-%04d-4a5e-9d55-0a9c1f1e2b3c", i))
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := &reconciler{t: t, f: f, drv: f.newDriver(), req: reqs[i]}
			for range 300 {
				done, _ := r.reconcile(ctx)
				if done {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			errs[i] = fmt.Errorf("%s did not become ready", reqs[i].Name)
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	byName := map[string]pvetest.VM{}
	vmids := map[int]bool{}
	for _, vm := range f.fake.VMs() {
		if vm.Template() {
			continue
		}
		if _, dup := byName[vm.Name]; dup {
			t.Errorf("two VMs named %s", vm.Name)
		}
		byName[vm.Name] = vm
		vmids[vm.VMID] = true
		if vm.VMID < 100000 || vm.VMID > 100024 {
			t.Errorf("VM %d is outside the VMID range", vm.VMID)
		}
	}
	if len(byName) != n || len(vmids) != n {
		t.Errorf("%d VMs on %d VMIDs; want %d on %d", len(byName), len(vmids), n, n)
	}
	for _, req := range reqs {
		vm, ok := byName[req.Name]
		if !ok {
			continue
		}
		if !strings.Contains(vm.Tags, proxmox.TagUIDPrefix+req.Mark.UID) || !strings.Contains(vm.Description, req.Mark.UID) {
			t.Errorf("VM %d (%s) carries tags %q; want %s's mark", vm.VMID, vm.Name, vm.Tags, req.Mark.UID)
		}
	}
	exists := 0
	for _, r := range f.fake.Requests() {
		if strings.Contains(r.Message, "config file already exists") {
			exists++
		}
	}
	t.Logf("%d clones lost a race for their VMID and were retried", exists)
	if got := len(f.fake.Volumes()); got != n {
		t.Errorf("%d seed files; want %d", got, n)
	}
}
