package proxmox_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

const (
	testProvider     = "ClusterProviderConfig home-pve"
	testInstallation = "test-install"
)

// fixture is a driver on a fake cluster. Its credentials are read from
// token and ca on every request, so tests can rotate them.
type fixture struct {
	t    testing.TB
	fake *pvetest.Server
	drv  *proxmox.Driver
	cfg  proxmox.Config
	rec  *recorder
	logs *testenv.Buffer
	opts proxmox.Options
	// clock is the drivers' clock: time.Now plus what advance added.
	clockMu sync.Mutex
	offset  time.Duration

	mu    sync.Mutex
	token string
	ca    []byte
}

type fixtureOption func(*fixtureOptions)

type fixtureOptions struct {
	fake   pvetest.Options
	config func(*proxmox.Config)
	driver func(*proxmox.Options)
}

func withFake(f func(*pvetest.Options)) fixtureOption {
	return func(o *fixtureOptions) { f(&o.fake) }
}

func withConfig(f func(*proxmox.Config)) fixtureOption {
	return func(o *fixtureOptions) { o.config = f }
}

func newFixture(t testing.TB, opts ...fixtureOption) *fixture {
	t.Helper()
	o := fixtureOptions{fake: pvetest.Options{Durations: pvetest.HeldDurations}}
	for _, opt := range opts {
		opt(&o)
	}
	fake := pvetest.New(t, o.fake)
	f := &fixture{t: t, fake: fake, logs: &testenv.Buffer{}, token: fake.Token(), ca: fake.CAPEM()}
	f.cfg = proxmox.Config{
		URL:               fake.URL,
		Nodes:             []string{"pve1", "pve2"},
		ISOStorage:        "local",
		Bridge:            "vmbr0",
		VLANTag:           20,
		DiskGiB:           10,
		InstallGuestAgent: true,
		Templates:         map[string]int{"debian-12": 9000},
		MachineTypes:      map[string]proxmox.MachineType{"small": {Cores: 1, MemoryMiB: 1024}, "large": {Cores: 4, MemoryMiB: 4096}},
	}
	if o.config != nil {
		o.config(&f.cfg)
	}
	// Every tier, the wire included: SecretsNeverLeak reads it all.
	log := funcr.New(func(prefix, args string) { f.logs.Line(strings.TrimSpace(prefix + " " + args)) }, funcr.Options{Verbosity: 10})
	do := proxmox.Options{
		Provider:    testProvider,
		Config:      f.cfg,
		Credentials: f.credentials,
		// Results kept for no time, and every check waits for its probe (the fake answers at once): every Get sees the fake's guests as they are.
		Prober:               &squid.Prober{Ask: fake.AskSquid, Wait: time.Minute, PositiveTTL: time.Nanosecond, NegativeTTL: time.Nanosecond},
		Log:                  &log,
		RetryFailedTaskAfter: time.Minute,
		Now:                  f.now,
	}
	if o.driver != nil {
		o.driver(&do)
	}
	f.opts = do
	f.drv = f.newDriver()
	f.rec = &recorder{Driver: f.drv, reqs: map[string]proxy.Request{}, deleting: map[string]bool{}}
	return f
}

// newDriver is a driver of a fresh process: nothing shared with the
// others (no connection pool, no record of clones, no facts).
func (f *fixture) newDriver() *proxmox.Driver {
	f.t.Helper()
	o := f.opts
	o.Shared = nil
	d, err := proxmox.New(o)
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

func (f *fixture) now() time.Time {
	f.clockMu.Lock()
	defer f.clockMu.Unlock()
	return time.Now().Add(f.offset)
}

// advance moves the drivers' clock forward.
func (f *fixture) advance(d time.Duration) {
	f.clockMu.Lock()
	defer f.clockMu.Unlock()
	f.offset += d
}

func (f *fixture) credentials(context.Context) (proxmox.Credentials, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return proxmox.Credentials{Token: f.token, CA: f.ca}, nil
}

func (f *fixture) setCredentials(token string, ca []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.token, f.ca = token, ca
}

// request is a valid request for the fake.
func (f *fixture) request(name, uid string) proxy.Request {
	return proxy.Request{
		Name:      name,
		Mark:      proxy.Mark{UID: uid, InstallationID: testInstallation},
		Placement: proxy.Placement{Location: "pve1", MachineType: "small", Image: "debian-12"},
		Proxy: proxy.Settings{
			Port:               3128,
			AllowedClientCIDRs: []string{"10.0.0.0/8"},
			AllowedPorts:       []int32{443},
		},
	}
}

// settle drives the instance to its end state as the controller would:
// tasks end, then Update (or Delete, when the instance is being deleted)
// takes the next step, until it is Running with the last request's spec
// and a proxy that answers, or gone.
func (f *fixture) settle(ctx context.Context, id string) error {
	if id == "" {
		// What is left of a VM that is gone (its seed): end its tasks.
		f.fake.FinishTasks()
		return nil
	}
	vmid, name, ok := splitID(id)
	if !ok {
		return fmt.Errorf("settle: %q is not an ID", id)
	}
	var last string
	for range 40 {
		f.fake.FinishTasks()
		if !f.fake.HasVM(vmid) {
			return nil
		}
		req, deleting, known := f.rec.state(name)
		if !known {
			return nil
		}
		ref := proxy.Ref{ID: id, Name: name, Mark: req.Mark, Placement: req.Placement}
		if deleting {
			if err := f.drv.Delete(ctx, ref); err != nil {
				last = err.Error()
			}
			continue
		}
		inst, err := f.drv.Get(ctx, ref)
		if proxy.IsNotFound(err) {
			return nil
		}
		if err == nil && inst.State == proxy.StateRunning && inst.ProxyReachable && inst.SpecHash == proxy.Hash(req) {
			return nil
		}
		if inst.Mark != req.Mark && err == nil && inst.Name == name && inst.Mark.UID != "" {
			return nil // not ours: nothing to drive
		}
		if _, err := f.drv.Update(ctx, ref, req); err != nil {
			last = err.Error()
		}
	}
	return fmt.Errorf("instance %s did not settle; last error: %s", id, last)
}

// vmidOf returns the VMID of an instance ID.
func vmidOf(t testing.TB, id string) int {
	t.Helper()
	vmid, _, ok := splitID(id)
	if !ok {
		t.Fatalf("%q is not an instance ID", id)
	}
	return vmid
}

func splitID(id string) (int, string, bool) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 || parts[0] != "vms" {
		return 0, "", false
	}
	vmid, err := strconv.Atoi(parts[1])
	return vmid, parts[2], err == nil
}

// recorder remembers the last request the driver was given per name, and
// which names are being deleted, so that settle can drive them.
type recorder struct {
	proxy.Driver
	mu       sync.Mutex
	reqs     map[string]proxy.Request
	deleting map[string]bool
}

func (r *recorder) state(name string) (proxy.Request, bool, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	req, ok := r.reqs[name]
	return req, r.deleting[name], ok
}

func (r *recorder) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	inst, err := r.Driver.Create(ctx, req)
	if err == nil {
		r.mu.Lock()
		r.reqs[req.Name], r.deleting[req.Name] = req, false
		r.mu.Unlock()
	}
	return inst, err
}

func (r *recorder) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	inst, err := r.Driver.Update(ctx, ref, req)
	if err == nil {
		r.mu.Lock()
		r.reqs[req.Name] = req
		r.mu.Unlock()
	}
	return inst, err
}

func (r *recorder) Delete(ctx context.Context, ref proxy.Ref) error {
	err := r.Driver.Delete(ctx, ref)
	r.mu.Lock()
	// Settle drives a deletion only for the resource that asked for it: a
	// Delete refused as another resource's leaves the VM alone.
	if req, ok := r.reqs[ref.Name]; ok && (ref.Mark == (proxy.Mark{}) || ref.Mark == req.Mark) {
		r.deleting[ref.Name] = true
	}
	r.mu.Unlock()
	return err
}
