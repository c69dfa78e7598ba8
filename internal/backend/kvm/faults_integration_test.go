package kvm_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// The fault-injection suite of the KVM backend on the real libvirtd,
// through the real sshd (docs/troubleshooting.md has its table). Faults
// are injected at two places only: the TCP connection to sshd runs
// through a relay the test cuts, and the driver's own spans (one per
// libvirt call, ended before the call returns to the driver) tell the
// test when a call starts and ends. Domains and volumes are named egp-hf-*
// so that other tests on the shared host are left alone.

// callHooks is a span processor calling the test at the start and end of
// each of the driver's libvirt calls, synchronously.
type callHooks struct {
	mu      sync.Mutex
	onStart func(call, target string)
	onEnd   func(call, target string)
	dials   atomic.Int32
}

func (c *callHooks) set(onStart, onEnd func(call, target string)) {
	c.mu.Lock()
	c.onStart, c.onEnd = onStart, onEnd
	c.mu.Unlock()
}

// callOf names a span's libvirt call and the domain or volume it is on.
func callOf(name string, attrs []attribute.KeyValue) (call, target string, ok bool) {
	call, ok = strings.CutPrefix(name, "kvm.libvirt.")
	for _, a := range attrs {
		if a.Key == "kvm.domain" || a.Key == "kvm.volume" {
			target = a.Value.AsString()
		}
	}
	return call, target, ok
}

func (c *callHooks) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	if s.Name() == "kvm.dial" {
		c.dials.Add(1)
	}
	c.mu.Lock()
	f := c.onStart
	c.mu.Unlock()
	if call, target, ok := callOf(s.Name(), s.Attributes()); ok && f != nil {
		f(call, target)
	}
}

func (c *callHooks) OnEnd(s sdktrace.ReadOnlySpan) {
	c.mu.Lock()
	f := c.onEnd
	c.mu.Unlock()
	if call, target, ok := callOf(s.Name(), s.Attributes()); ok && f != nil {
		f(call, target)
	}
}

func (c *callHooks) Shutdown(context.Context) error   { return nil }
func (c *callHooks) ForceFlush(context.Context) error { return nil }

// relay forwards loopback TCP connections to sshd, and cuts them when
// told: at once, once some bytes more went up, or at the next bytes that
// come down (the answer to a call the host has acted on).
type relay struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  []net.Conn
	refuse bool
	// upLeft is how many more bytes go up before the cut; -1 when not
	// armed.
	upLeft int64
	// onAnswer cuts before the next bytes down are passed on.
	onAnswer bool
	cuts     int
}

func newRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, upLeft: -1}
	t.Cleanup(func() { _ = ln.Close(); r.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			refuse := r.refuse
			r.mu.Unlock()
			if refuse {
				_ = c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, up)
			r.mu.Unlock()
			go r.copy(up, c, true)
			go r.copy(c, up, false)
		}
	}()
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) copy(dst, src net.Conn, upward bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			r.mu.Lock()
			cut := false
			switch {
			case upward && r.upLeft >= 0:
				if int64(n) >= r.upLeft {
					n, cut = int(r.upLeft), true
				} else {
					r.upLeft -= int64(n)
				}
			case !upward && r.onAnswer:
				n, cut = 0, true
			}
			r.mu.Unlock()
			if n > 0 {
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
			if cut {
				r.cut()
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// cut closes every connection now and disarms.
func (r *relay) cut() {
	r.mu.Lock()
	conns := r.conns
	r.conns, r.upLeft, r.onAnswer = nil, -1, false
	if len(conns) > 0 {
		r.cuts++
	}
	r.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (r *relay) setRefuse(v bool) {
	r.mu.Lock()
	r.refuse = v
	r.mu.Unlock()
}

func (r *relay) cutAfterUp(n int64) {
	r.mu.Lock()
	r.upLeft = n
	r.mu.Unlock()
}

func (r *relay) cutOnAnswer() {
	r.mu.Lock()
	r.onAnswer = true
	r.mu.Unlock()
}

func (r *relay) cutCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cuts
}

// faultEnv is a driver on the real host, reached through the relay, with
// an image served from loopback.
type faultEnv struct {
	t     *testing.T
	h     *kvmtest.Host
	relay *relay
	hooks *callHooks
	cfg   kvm.Config
	opts  kvm.Options
	b     *kvm.Backend
	d     *kvm.Driver
	// names are the instances this test made, purged at its end.
	names []string
}

func newFaultEnv(t *testing.T, mutate ...func(*faultEnv)) *faultEnv {
	t.Helper()
	h := kvmtest.Up(t)
	e := &faultEnv{t: t, h: h, relay: newRelay(t, h.Values["SSH_ADDRESS"]), hooks: &callHooks{}}
	host := h.KVMHost("local")
	host.Address = e.relay.addr()
	// The relay is another host:port to known_hosts: the same key there.
	_, port, _ := net.SplitHostPort(e.relay.addr())
	var known bytes.Buffer
	for _, l := range strings.Split(strings.TrimSpace(string(h.KnownHosts)), "\n") {
		if f := strings.Fields(l); len(f) >= 3 {
			known.WriteString("[127.0.0.1]:" + port + " " + strings.Join(f[1:], " ") + "\n")
		}
	}
	e.cfg = kvm.Config{
		Name:         "ClusterProviderConfig faults",
		Credentials:  kvm.Credentials{Key: h.Key, KnownHosts: known.Bytes()},
		DiskSizeGB:   1,
		Images:       map[string]kvm.Image{"empty": {URL: emptyImage(t), Format: "qcow2", Firmware: "bios"}},
		MachineTypes: map[string]kvm.MachineType{"tiny": {VCPUs: 1, MemoryMiB: 128}},
		Hosts:        []kvm.Host{host},
	}
	e.opts = kvm.Options{Tracer: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.hooks)).Tracer("faults")}
	for _, m := range mutate {
		m(e)
	}
	t.Cleanup(func() {
		e.b.Close()
		for _, n := range e.names {
			h.Purge(n)
		}
		e.dropBase()
	})
	e.start()
	return e
}

// start builds a new Backend and Driver: a provider (re)started with no
// memory of what it did.
func (e *faultEnv) start() {
	if e.b != nil {
		e.b.Close()
	}
	e.b = kvm.NewBackend(e.opts)
	e.d = e.b.Driver(e.cfg)
}

func (e *faultEnv) request(name string) proxy.Request {
	if !slices.Contains(e.names, name) {
		// What a run killed before its clean-up left under this name
		// would make the first create a different one.
		e.h.Purge(name)
		e.names = append(e.names, name)
	}
	return proxy.Request{
		Name:      name,
		Mark:      proxy.Mark{UID: "0c8f6a1e-0000-4e2a-9c3f-" + strings.Repeat("f", 12), InstallationID: "faults"},
		Placement: proxy.Placement{Location: "local", MachineType: "tiny", Image: "empty"},
		Proxy:     proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"192.168.213.0/24"}, AllowedPorts: []int32{443}},
	}
}

// liveRef is the resource's Ref with its status lost: no ID.
func liveRef(req proxy.Request) proxy.Ref {
	return proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement, Live: true}
}

// reconcile observes and creates as the controller does until the domain
// runs (no OS boots from the empty image: "booting" is as far as it gets).
func (e *faultEnv) reconcile(req proxy.Request) proxy.Instance {
	e.t.Helper()
	var inst proxy.Instance
	var err, createErr error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		inst, err = e.d.Get(context.Background(), liveRef(req))
		if proxy.IsNotFound(err) {
			inst, err = e.d.Create(context.Background(), req)
			if err != nil {
				createErr = err
			}
		}
		if err == nil && strings.HasPrefix(inst.Progress, "booting") {
			return inst
		}
	}
	e.t.Fatalf("%s never ran: %+v, %v (last error of a Create: %v)", req.Name, inst, err, createErr)
	return inst
}

// deleteAsTheController is a resource's deletion as the controller runs
// it: Get with Ref.Deleting, Delete while Get finds something.
func (e *faultEnv) deleteAsTheController(r proxy.Ref) {
	e.t.Helper()
	r.Deleting, r.Live = true, true
	for range 10 {
		_, err := e.d.Get(context.Background(), r)
		if proxy.IsNotFound(err) {
			return
		}
		if err != nil {
			e.t.Fatalf("Get of the resource being deleted: %v", err)
		}
		if err := e.d.Delete(context.Background(), r); err != nil {
			e.t.Fatalf("Delete: %v", err)
		}
	}
	e.t.Fatal("the deletion never ended: Get keeps finding the instance")
}

// pieces are the domains and volumes of instance name on the host.
func (e *faultEnv) pieces(name string) (domains, volumes []string) {
	for _, d := range e.h.Domains(e.t) {
		if d == name {
			domains = append(domains, d)
		}
	}
	for _, v := range e.h.Volumes(e.t) {
		if strings.HasPrefix(v, name) {
			volumes = append(volumes, v)
		}
	}
	return domains, volumes
}

// base is this test's base image volume (named as the driver names it:
// the key and a digest of URL, sha256 and format); its marker is
// base+".sha256".
func (e *faultEnv) base() string {
	img := e.cfg.Images["empty"]
	sum := sha256.Sum256([]byte(img.URL + "\n" + img.SHA256 + "\n" + img.Format))
	return "egressproxy-base-empty-" + hex.EncodeToString(sum[:])[:12] + "." + img.Format
}

// dropBase removes this test's base image and marker.
func (e *faultEnv) dropBase() {
	for _, v := range []string{e.base(), e.base() + ".sha256"} {
		_ = exec.Command("virsh", "-c", "qemu:///system", "vol-delete", "--pool", e.h.Values["POOL"], v).Run()
	}
}

// TestIntegrationLibvirtFaults_manyVolumeReadsOnOneConnection: a resource
// being deleted whose domain is gone reads its overlay and seed (the
// seed's content, by a volume download) at every observation, on one
// pooled connection. libvirtd sends a download's data before the call's
// reply at times; go-libvirt then read a short (or empty) volume and
// stopped answering on that connection for good, so the next call ran
// out of its budget: the "Delete did not answer within 30s" seen after a
// `virsh destroy` during a background start. Every observation answers,
// and reports both volumes.
func TestIntegrationLibvirtFaults_manyVolumeReadsOnOneConnection(t *testing.T) {
	e := newFaultEnv(t, func(e *faultEnv) { e.opts.Budgets = kvm.Budgets{RPC: 10 * time.Second} })
	req := e.request("egp-hf-reads")
	e.reconcile(req)
	e.h.Virsh(t, "destroy", req.Name)
	e.h.Virsh(t, "undefine", req.Name)
	r := liveRef(req)
	r.Deleting = true
	dials := e.hooks.dials.Load()
	for i := range 60 {
		got, err := e.d.Get(context.Background(), r)
		if err != nil || !strings.Contains(got.Progress, req.Name+".qcow2, "+req.Name+"-seed.iso remain") {
			t.Fatalf("observation %d of the resource being deleted = %+v, %v; want both volumes reported", i, got, err)
		}
	}
	if n := e.hooks.dials.Load() - dials; n != 0 {
		t.Errorf("%d connections dialled during the observations; want all on the pooled one", n)
	}
	e.deleteAsTheController(r)
	if doms, vols := e.pieces(req.Name); len(doms)+len(vols) != 0 {
		t.Errorf("left after the deletion: %v %v", doms, vols)
	}
}

// smallPool is a directory pool of its own on a tmpfs of size MiB, for
// a full pool that the test can grow: transient, in the libvirt host's
// data folder (kvmtest.Host.TmpfsPool), so that a killed run leaves
// nothing the next run or hack/libvirt-down.sh does not remove.
type smallPool struct {
	t    *testing.T
	h    *kvmtest.Host
	name string
	dir  string
}

func newSmallPool(t *testing.T, h *kvmtest.Host, name string, sizeMiB int) *smallPool {
	t.Helper()
	return &smallPool{t: t, h: h, name: name, dir: h.TmpfsPool(t, name, sizeMiB)}
}

// grow makes the filesystem larger, behind libvirt's back.
func (p *smallPool) grow(sizeMiB int) {
	p.t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,size="+strconv.Itoa(sizeMiB)+"M", p.dir).CombinedOutput(); err != nil {
		p.t.Fatalf("remount: %v: %s", err, out)
	}
}

func (p *smallPool) volumes() []string {
	var out []string
	for _, l := range strings.Split(p.h.Virsh(p.t, "vol-list", "--pool", p.name), "\n")[2:] {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}

// TestIntegrationLibvirtFaults_quota: a real pool too small for the
// proxy's disk, and a machine type larger than the host's memory, are
// Quota before anything is made (no domain, no volume, no download); the
// pool grown on the host (libvirt not told) lets the same Create through,
// and the proxy runs and is deleted leaving nothing. The host's memory
// cannot be grown by a test: a machine type that fits runs instead.
func TestIntegrationLibvirtFaults_quota(t *testing.T) {
	var pool *smallPool
	e := newFaultEnv(t, func(e *faultEnv) {
		pool = newSmallPool(t, e.h, "egp-hf-small", 32)
		e.cfg.Hosts[0].Pool = pool.name
		e.cfg.MachineTypes["huge"] = kvm.MachineType{VCPUs: 1, MemoryMiB: 4 << 20} // 4 TiB
	})
	ctx := context.Background()

	{ // the pool full
		req := e.request("egp-hf-pool-full")
		_, err := e.d.Create(ctx, req)
		if proxy.ClassOf(err) != proxy.ClassQuota || !strings.Contains(err.Error(), "storage pool egp-hf-small on host local has") {
			t.Fatalf("Create into a full pool = %s %v; want Quota naming the pool", proxy.ClassOf(err), err)
		}
		if doms, vols := e.pieces(req.Name); len(doms)+len(vols) != 0 || len(pool.volumes()) != 0 {
			t.Fatalf("made under Quota: %v %v, pool %v", doms, vols, pool.volumes())
		}
		pool.grow(2048)
		e.reconcile(req)
		want := []string{e.base(), e.base() + ".sha256", req.Name + "-seed.iso", req.Name + ".qcow2"}
		slices.Sort(want)
		if doms, _ := e.pieces(req.Name); len(doms) != 1 || !slices.Equal(pool.volumes(), want) {
			t.Errorf("after the pool grew: domains %v, pool %v; want one domain and %v", doms, pool.volumes(), want)
		}
		e.deleteAsTheController(liveRef(req))
		if doms, vols := e.pieces(req.Name); len(doms)+len(vols) != 0 {
			t.Errorf("left after the deletion: %v %v", doms, vols)
		}
		if got, want := pool.volumes(), []string{e.base(), e.base() + ".sha256"}; !slices.Equal(got, want) {
			t.Errorf("pool holds %v; want only the shared base %v", got, want)
		}
	}

	{ // the host's memory short
		req := e.request("egp-hf-memory")
		req.Placement.MachineType = "huge"
		_, err := e.d.Create(ctx, req)
		if proxy.ClassOf(err) != proxy.ClassQuota || !strings.Contains(err.Error(), "host local has") || !strings.Contains(err.Error(), "machine type huge needs 4194304 MiB") {
			t.Fatalf("Create larger than the host's memory = %s %v; want Quota naming the host and machine type", proxy.ClassOf(err), err)
		}
		if doms, vols := e.pieces(req.Name); len(doms)+len(vols) != 0 {
			t.Fatalf("made under Quota: %v %v", doms, vols)
		}
		req.Placement.MachineType = "tiny"
		e.reconcile(req)
		e.deleteAsTheController(liveRef(req))
		if doms, vols := e.pieces(req.Name); len(doms)+len(vols) != 0 {
			t.Errorf("left after the deletion: %v %v", doms, vols)
		}
	}
}

// createSteps are the calls by which a Create changes the host.
var createSteps = map[string]bool{"StorageVolCreateXML": true, "StorageVolUpload": true, "StorageVolDelete": true,
	"StoragePoolRefresh": true, "DomainDefineXML": true, "DomainCreate": true}

// checkRuns asserts the proxy stands on the host as one domain, its
// overlay backed by the one shared base, and its seed.
func (e *faultEnv) checkRuns(where, name string) {
	e.t.Helper()
	doms, vols := e.pieces(name)
	if want := []string{name + "-seed.iso", name + ".qcow2"}; len(doms) != 1 || !slices.Equal(vols, want) {
		e.t.Errorf("%s: domains %v, volumes %v; want one domain and %v", where, doms, vols, want)
	}
	all := e.h.Volumes(e.t)
	if !slices.Contains(all, e.base()) || !slices.Contains(all, e.base()+".sha256") {
		e.t.Errorf("%s: the base %s or its marker is missing", where, e.base())
	}
	if x := e.h.Virsh(e.t, "vol-dumpxml", "--pool", e.h.Values["POOL"], name+".qcow2"); !strings.Contains(x, "<backingStore>") || !strings.Contains(x, e.base()) {
		e.t.Errorf("%s: the overlay does not back onto the shared base:\n%s", where, x)
	}
}

// checkGone asserts nothing of the proxy is left (the shared base may be).
func (e *faultEnv) checkGone(where, name string) {
	e.t.Helper()
	if doms, vols := e.pieces(name); len(doms)+len(vols) != 0 {
		e.t.Errorf("%s: left after the deletion: %v %v", where, doms, vols)
	}
}

// TestIntegrationLibvirtFaults_crashAfterEachCreateStep stops the
// provider right after each call by which a Create changes the host (the
// base image's volume, upload, marker and refresh, the overlay, the
// seed's volume and upload, the define, the start; the image not cached
// so that its steps are part of it): the connection is cut as the call
// returns, and a new driver with no memory and no status (no ID) takes
// over. Resumed, the proxy runs as one domain with one overlay on the one
// base and one seed; deleted instead, nothing of it is left.
func TestIntegrationLibvirtFaults_crashAfterEachCreateStep(t *testing.T) {
	e := newFaultEnv(t)
	ctx := context.Background()
	req := e.request("egp-hf-crash")
	var mu sync.Mutex
	var steps []string
	e.hooks.set(nil, func(call, target string) {
		if createSteps[call] {
			mu.Lock()
			steps = append(steps, call+" "+target)
			mu.Unlock()
		}
	})
	e.reconcile(req)
	e.hooks.set(nil, nil)
	e.deleteAsTheController(liveRef(req))
	mu.Lock()
	ref := slices.Clone(steps)
	mu.Unlock()
	if len(ref) < 10 {
		t.Fatalf("a create made only %d changes: %v", len(ref), ref)
	}
	t.Logf("steps of a create: %v", ref)
	for k := 1; k <= len(ref); k++ {
		for _, resume := range []bool{true, false} {
			where := fmt.Sprintf("crash after step %d of %d (%s), then %s", k, len(ref), ref[k-1], map[bool]string{true: "resumed", false: "deleted"}[resume])
			e.dropBase()
			e.start()
			crashed := make(chan struct{})
			n := 0
			e.hooks.set(nil, func(call, _ string) {
				if !createSteps[call] {
					return
				}
				mu.Lock()
				n++
				hit := n == k
				mu.Unlock()
				if hit {
					e.relay.setRefuse(true)
					e.relay.cut()
					close(crashed)
				}
			})
			_, _ = e.d.Create(ctx, req)
			select {
			case <-crashed:
			case <-time.After(time.Minute):
				t.Fatalf("%s: the create never got there", where)
			}
			e.hooks.set(nil, nil)
			e.start()
			e.relay.setRefuse(false)
			if resume {
				e.reconcile(req)
				e.checkRuns(where, req.Name)
			}
			e.deleteAsTheController(liveRef(req))
			e.checkGone(where, req.Name)
		}
	}
}

// TestIntegrationLibvirtFaults_connectionCutInTheMiddleOfACall cuts the
// SSH connection during a Create's calls (the image cached): half-way
// through the seed's upload, and after the host created the overlay,
// defined the domain or started it but before the answer came back. The
// Create is Transient; the next reconcile, on the same driver, dials again
// and finishes with one domain, overlay and seed; the deletion leaves
// nothing.
func TestIntegrationLibvirtFaults_connectionCutInTheMiddleOfACall(t *testing.T) {
	e := newFaultEnv(t)
	ctx := context.Background()
	warm := e.request("egp-hf-warm")
	e.reconcile(warm)
	e.deleteAsTheController(liveRef(warm))
	cases := []struct {
		name, call, suffix string
		arm                func()
	}{
		{"SeedUploadHalfWay", "StorageVolUpload", "-seed.iso", func() { e.relay.cutAfterUp(16 << 10) }},
		{"OverlayCreatedAnswerLost", "StorageVolCreateXML", ".qcow2", e.relay.cutOnAnswer},
		{"DomainDefinedAnswerLost", "DomainDefineXML", "", e.relay.cutOnAnswer},
		{"DomainStartedAnswerLost", "DomainCreate", "", e.relay.cutOnAnswer},
	}
	for _, tc := range cases {
		req := e.request("egp-hf-cut")
		var once sync.Once
		e.hooks.set(func(call, target string) {
			if call == tc.call && target == req.Name+tc.suffix {
				once.Do(tc.arm)
			}
		}, nil)
		cuts, dials := e.relay.cutCount(), e.hooks.dials.Load()
		_, err := e.d.Create(ctx, req)
		e.hooks.set(nil, nil)
		if e.relay.cutCount() == cuts {
			t.Fatalf("%s: the connection was never cut (Create = %v)", tc.name, err)
		}
		if !proxy.IsTransient(err) {
			t.Errorf("%s: Create under the cut = %s %v; want Transient", tc.name, proxy.ClassOf(err), err)
		}
		e.reconcile(req)
		if e.hooks.dials.Load() == dials {
			t.Errorf("%s: no new connection was dialled after the cut", tc.name)
		}
		e.checkRuns(tc.name, req.Name)
		e.deleteAsTheController(liveRef(req))
		e.checkGone(tc.name, req.Name)
	}
}

// TestIntegrationLibvirtFaults_heldDomainJob holds the domain's job lock
// as libvirt really holds it: the domain's QEMU is stopped (SIGSTOP) and
// `virsh suspend` waits on its monitor with the job taken, so every other
// call needing the job waits ("cannot acquire state change lock" after
// libvirt's 30 s). The driver's Get needs no job and answers; its Delete
// destroys the domain (libvirt kills QEMU and takes the job over) and
// leaves nothing; the suspend fails. A Create of a held domain is never
// needed: one that exists is only observed.
func TestIntegrationLibvirtFaults_heldDomainJob(t *testing.T) {
	e := newFaultEnv(t)
	req := e.request("egp-hf-held")
	e.reconcile(req)
	pid, err := os.ReadFile("/run/libvirt/qemu/" + req.Name + ".pid")
	if err != nil {
		t.Fatalf("the domain's QEMU pid: %v", err)
	}
	qemu := strings.TrimSpace(string(pid))
	if out, err := exec.Command("kill", "-STOP", qemu).CombinedOutput(); err != nil {
		t.Fatalf("kill -STOP %s: %v: %s", qemu, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("kill", "-CONT", qemu).Run() })
	var suspendOut bytes.Buffer
	suspend := exec.Command("virsh", "-c", "qemu:///system", "suspend", req.Name)
	suspend.Stdout, suspend.Stderr = &suspendOut, &suspendOut
	if err := suspend.Start(); err != nil {
		t.Fatal(err)
	}
	suspended := make(chan error, 1)
	go func() { suspended <- suspend.Wait() }()
	// The suspend holds the job once libvirt has written "stop" to QEMU's
	// monitor, where it stays unread: the monitor socket's receive queue.
	testenv.WaitFor(t, "virsh suspend to hold the domain's job", 30*time.Second, func() (bool, string) {
		out, _ := exec.Command("ss", "-x", "-p").CombinedOutput()
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 2 && strings.Contains(l, "monitor.sock") && strings.Contains(l, "pid="+qemu+",") && f[2] != "0" {
				return true, l
			}
		}
		return false, string(out)
	})
	for range 3 {
		got, err := e.d.Get(context.Background(), liveRef(req))
		if err != nil || got.State != proxy.StateProvisioning {
			t.Fatalf("Get while the job is held = %+v, %v; want the booting domain", got, err)
		}
	}
	select {
	case err := <-suspended:
		t.Fatalf("virsh suspend returned while QEMU was stopped (%v: %s): the job was never held", err, suspendOut.String())
	default:
	}
	e.deleteAsTheController(liveRef(req))
	e.checkGone("held job", req.Name)
	if err := <-suspended; err == nil {
		t.Errorf("virsh suspend of a domain deleted under it succeeded: %s", suspendOut.String())
	}
}
