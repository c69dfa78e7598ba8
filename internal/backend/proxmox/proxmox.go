// Package proxmox is the ProxmoxProxy backend: a proxy is a VM cloned
// from a template on a Proxmox VE cluster, given a NoCloud seed ISO that
// installs and configures Squid (internal/cloudinit, internal/squid), and
// found again through the API alone.
//
// The driver talks to Proxmox through API, a seam of exactly the
// endpoints it calls; Client is the production implementation, a thin
// net/http client that reads its credentials on every request. Nothing the
// provisioning needs to resume is kept in memory: every step is decided
// from what Proxmox shows (the VM's lock, tags, config and task list), so
// a provider restart or a lost status at any point resumes where it was.
//
// Create never waits for a task. It clones, and later calls (Update, or
// Create again) continue the sequence from what they find:
//
//	allocate a VMID -> clone -> upload the seed + configure -> resize -> start -> complete
//
// "Complete" is the spec-hash tag; until it is there Get reports the VM
// as Provisioning with a SpecHash that matches no request, so the
// controller calls Update, which takes the next step.
package proxmox

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/egressproxy/provider-egressproxy/internal/backend/batch"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Defaults of Config.
const (
	DefaultVMIDMin        = 100000
	DefaultVMIDMax        = 199999
	DefaultRequestTimeout = 30 * time.Second
	// DefaultRetryFailedTaskAfter is how long a failed task is reported
	// before its step is tried again.
	DefaultRetryFailedTaskAfter = time.Minute
)

// Config is the proxmox block of a ProviderConfig, resolved.
type Config struct {
	// URL of the API, https://host:8006.
	URL string
	// Guard dials the API when the URL is a tenant's (a namespaced
	// config's): it refuses the provider's own network, and the API's
	// answers are not quoted in errors. Nil for the platform's configs.
	Guard *netguard.Guard
	// TenantGuard dials the address the guest agent reports of a VM whose
	// guest a tenant writes (Ref.TenantGuest: its cloud-init) on the
	// platform's config, and quiets what it answered. Nil: Guard.
	TenantGuard *netguard.Guard
	// InsecureSkipTLSVerify turns off certificate verification.
	InsecureSkipTLSVerify bool
	// Nodes proxies may run on.
	Nodes []string
	// ISOStorage holds the seed ISOs.
	ISOStorage string
	// Bridge and VLANTag rewrite net0 when set.
	Bridge  string
	VLANTag int
	// VMIDMin and VMIDMax bound the VMIDs of proxies.
	VMIDMin, VMIDMax int
	// DiskGiB grows the boot disk to this size when it is smaller.
	DiskGiB int
	// InstallGuestAgent installs qemu-guest-agent at first boot.
	InstallGuestAgent bool
	// RequestTimeout bounds each API request.
	RequestTimeout time.Duration
	// Templates by catalogue key: their VMIDs.
	Templates map[string]int
	// MachineTypes by catalogue key.
	MachineTypes map[string]MachineType
}

// MachineType is one size.
type MachineType struct {
	Cores     int
	MemoryMiB int
}

// Options configure a Driver.
type Options struct {
	// Provider is the configured name ("ClusterProviderConfig home-pve");
	// every error carries it.
	Provider string
	// Config is the proxmox block.
	Config Config
	// Credentials are asked for on every request.
	Credentials CredentialsFunc
	// Shared is the state drivers of one process share (connection pool,
	// clones in flight, facts cache); nil makes a private one.
	Shared *Shared
	// API replaces the Client built from Config.URL and Credentials (tests
	// that fake the seam itself). It is wrapped by Observe all the same.
	API API
	// Prober checks that Squid with the VM's own configuration answers;
	// default Shared's.
	Prober *squid.Prober
	// Resolver resolves the API URL's host, whose addresses each guest's
	// Squid denies; default net.DefaultResolver.
	Resolver netguard.Resolver
	// Log, when set, receives the driver's log lines; otherwise they go to
	// the logger in the call's context.
	Log *logr.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// RetryFailedTaskAfter is how long a failed task is reported (as the
	// error of the call that would redo its step) before the step is
	// tried again; default DefaultRetryFailedTaskAfter.
	RetryFailedTaskAfter time.Duration
}

// Shared is what the drivers of one process share across reconciles: the
// connection pool, the clones this process started (a clone in flight has
// no name in Proxmox yet), and facts read from VM configs that never
// change for a given VM, mark and spec (its creation time and proxy port),
// so a steady-state Get needs no config read. None of it decides anything
// destructive: ownership is always read from Proxmox. It is safe for
// concurrent use; the zero value is ready.
type Shared struct {
	Transports Transports
	// Prober is the readiness check of every driver that has none of its
	// own.
	Prober squid.Prober
	// ObserveMaxAge bounds the age of the shared /cluster/resources
	// snapshot a steady VM's Get is answered from (batch.go); zero means
	// batch.DefaultMaxAge. Set it before the first Get.
	ObserveMaxAge time.Duration

	mu sync.Mutex
	// clones and facts are keyed by the API's URL too: one process serves
	// several clusters, whose VMIDs overlap.
	clones map[cloneKey]pendingClone
	facts  map[factKey]facts
	warned map[string]bool
	// steady are the VMs whose last Get found them steady (batch.go).
	steady   batch.Map[vmKey, steadyVM]
	snapOnce sync.Once
	snaps    *batch.Snapshots[vmIndex]
}

type cloneKey struct {
	url  string
	vmid int
}

// pendingClone is a clone this process started and has not seen finish.
type pendingClone struct {
	name      string
	mark      proxy.Mark
	createdAt time.Time
	upid      string
	node      string
}

type factKey struct {
	url       string
	vmid      int
	uid, spec string
}

type facts struct {
	createdAt time.Time
	port      int
}

func (s *Shared) clone(url string, vmid int) (pendingClone, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clones[cloneKey{url, vmid}]
	return c, ok
}

func (s *Shared) cloneByName(url, name string) (int, pendingClone, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, c := range s.clones {
		if k.url == url && c.name == name {
			return k.vmid, c, true
		}
	}
	return 0, pendingClone{}, false
}

func (s *Shared) setClone(url string, vmid int, c pendingClone) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.clones == nil {
		s.clones = map[cloneKey]pendingClone{}
	}
	s.clones[cloneKey{url, vmid}] = c
}

// forgetClones drops the records of the cluster's clones that ended (their
// VM has a name, or is gone), and the facts of the cluster's VMs that are
// gone: nothing is kept about a VM that no longer exists.
func (s *Shared) forgetClones(url string, vms []Resource) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.facts) > 0 {
		present := make(map[int]bool, len(vms))
		for _, r := range vms {
			if r.Type == "qemu" {
				present[r.VMID] = true
			}
		}
		for k := range s.facts {
			if k.url == url && !present[k.vmid] {
				delete(s.facts, k)
			}
		}
	}
	if len(s.clones) == 0 {
		return
	}
	for k := range s.clones {
		if k.url != url {
			continue
		}
		i := slices.IndexFunc(vms, func(r Resource) bool { return r.Type == "qemu" && r.VMID == k.vmid })
		if i < 0 || vms[i].Name != "" {
			delete(s.clones, k)
		}
	}
}

// factCount is how many facts are kept (for tests).
func (s *Shared) factCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.facts)
}

func (s *Shared) fact(k factKey) (facts, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.facts[k]
	return f, ok
}

func (s *Shared) setFact(k factKey, f facts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.facts == nil {
		s.facts = map[factKey]facts{}
	}
	if len(s.facts) > 100000 {
		clear(s.facts) // a crude bound: they are re-read on demand
	}
	s.facts[k] = f
}

// warnedKept bounds Shared.warned: configs come and go (a tenant's too),
// and nothing says when one went.
const warnedKept = 1024

// warnOnce reports whether key was not warned about yet, and records it.
// Past warnedKept keys it forgets them all: a config then warns once more.
func (s *Shared) warnOnce(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.warned[key] {
		return false
	}
	if s.warned == nil || len(s.warned) >= warnedKept {
		s.warned = map[string]bool{}
	}
	s.warned[key] = true
	return true
}

// Driver is the proxmox proxy.Driver.
type Driver struct {
	provider string
	cfg      Config
	api      API
	shared   *Shared
	prober   *squid.Prober
	log      *logr.Logger
	now      func() time.Time
	retry    time.Duration
	creds    CredentialsFunc
	resolver netguard.Resolver
}

var _ proxy.Driver = (*Driver)(nil)

// New returns a driver for o. It makes no request.
func New(o Options) (*Driver, error) {
	d := &Driver{provider: o.Provider, cfg: o.Config, shared: o.Shared, prober: o.Prober, log: o.Log, now: o.Now,
		retry: o.RetryFailedTaskAfter, creds: o.Credentials, resolver: o.Resolver}
	if d.resolver == nil {
		d.resolver = net.DefaultResolver
	}
	if d.shared == nil {
		d.shared = &Shared{}
	}
	if d.cfg.VMIDMin == 0 && d.cfg.VMIDMax == 0 {
		d.cfg.VMIDMin, d.cfg.VMIDMax = DefaultVMIDMin, DefaultVMIDMax
	}
	if d.cfg.VMIDMin < 100 || d.cfg.VMIDMax < d.cfg.VMIDMin {
		return nil, proxy.WithContext(proxy.Permanentf("proxmox.vmidRange %d-%d is not a range of VMIDs", d.cfg.VMIDMin, d.cfg.VMIDMax), d.provider, "connect")
	}
	if d.cfg.RequestTimeout <= 0 {
		d.cfg.RequestTimeout = DefaultRequestTimeout
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.retry <= 0 {
		d.retry = DefaultRetryFailedTaskAfter
	}
	if d.prober == nil {
		d.prober = &d.shared.Prober
	}
	api := o.API
	if api == nil {
		if o.Credentials == nil {
			return nil, proxy.WithContext(proxy.Permanentf("no credentials"), d.provider, "connect")
		}
		c, err := NewClient(d.cfg.URL, o.Credentials, d.cfg.InsecureSkipTLSVerify, d.cfg.RequestTimeout, &d.shared.Transports)
		if err != nil {
			return nil, proxy.WithContext(err, d.provider, "connect")
		}
		c.guard = d.cfg.Guard
		c.wire = d.logger
		api = c
	}
	server := d.cfg.URL
	if u, err := url.Parse(d.cfg.URL); err == nil && u.Host != "" {
		server = u.Host
		if u.Port() == "" {
			server = net.JoinHostPort(u.Hostname(), "443")
		}
	}
	d.api = Observe(api, server, d.logger)
	return d, nil
}

// warn logs, once per process and config, that TLS verification is off
// (the health check also sets the config's Secure condition False). It
// runs at a call's start, to log through the call's logger.
func (d *Driver) warn(ctx context.Context) {
	if d.cfg.InsecureSkipTLSVerify && d.shared.warnOnce("insecure "+d.provider) {
		d.logger(ctx).Info("WARNING: proxmox.insecureSkipTLSVerify is true: the API's certificate is not verified, so the token can be intercepted")
	}
}

func (d *Driver) logger(ctx context.Context) logr.Logger {
	if d.log != nil {
		return telemetry.Logger(ctx, d.log.WithValues("provider", d.provider))
	}
	return telemetry.Logger(ctx, logr.FromContextOrDiscard(ctx).WithName("proxmox").WithValues("provider", d.provider))
}

// wrap classifies err and names the provider and the operation.
func (d *Driver) wrap(err error, op string) error {
	return proxy.WithContext(classify(err), d.provider, op)
}

// placement resolves the request's catalogue keys.
func (d *Driver) placement(p proxy.Placement) (node string, tmplVMID int, mt MachineType, err error) {
	node = p.Location
	if node == "" && len(d.cfg.Nodes) == 1 {
		node = d.cfg.Nodes[0]
	}
	if !slices.Contains(d.cfg.Nodes, node) {
		return "", 0, MachineType{}, proxy.Permanentf("node %q is not one of proxmox.nodes %v", node, d.cfg.Nodes)
	}
	tmplVMID, ok := d.cfg.Templates[p.Image]
	if !ok {
		return "", 0, MachineType{}, proxy.Permanentf("image %q is not a key of proxmox.templates", p.Image)
	}
	mt, ok = d.cfg.MachineTypes[p.MachineType]
	if !ok {
		return "", 0, MachineType{}, proxy.Permanentf("machine type %q is not a key of proxmox.machineTypes", p.MachineType)
	}
	return node, tmplVMID, mt, nil
}

func (d *Driver) isoVolID(name, uid string) string {
	return d.cfg.ISOStorage + ":iso/" + seedFile(name, uid)
}

// describeMark is a mark in messages.
func describeMark(m proxy.Mark) string {
	if m == (proxy.Mark{}) {
		return "no ownership mark"
	}
	return fmt.Sprintf("UID %q, installation %q", m.UID, m.InstallationID)
}
