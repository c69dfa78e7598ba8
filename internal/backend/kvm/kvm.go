// Package kvm is the KVMProxy driver: Squid in a libvirt domain on a host
// reached over SSH. It implements proxy.Driver behind a seam of exactly the
// go-libvirt calls it makes (Libvirt), over pooled SSH connections, with an
// image cache that downloads base images in the background so that Create
// never waits for a download or a boot.
//
// What lands on a host, per proxy: a domain named after the instance
// carrying an ownership element in the provider's metadata namespace, a
// qcow2 overlay <name>.qcow2 on a shared base image, and a NoCloud seed
// <name>-seed.iso. Per image and host: the base volume
// egressproxy-base-<key>-<hash>.<format> and its .sha256 marker.
package kvm

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// DefaultSocket and DefaultPool are the host defaults.
const (
	DefaultSocket = "/var/run/libvirt/libvirt-sock"
	DefaultPool   = "default"
)

// Config is one ProviderConfig's kvm block, resolved (Secrets read).
type Config struct {
	// Name is the configured provider name errors carry.
	Name string
	// Credentials for every host.
	Credentials Credentials
	// DiskSizeGB is each proxy's overlay capacity.
	DiskSizeGB int32
	// InstallGuestAgent installs qemu-guest-agent at first boot when the
	// image lacks it.
	InstallGuestAgent bool
	// VendorData is the seed's vendor-data, "" for none; secret: never
	// logged.
	VendorData string
	// Images by catalogue key.
	Images map[string]Image
	// MachineTypes by catalogue key.
	MachineTypes map[string]MachineType
	// Hosts in config order.
	Hosts []Host
	// MaxImageBytes is the largest image the config's proxies boot from,
	// downloaded or already in the pool; DefaultMaxImageBytes when 0. A
	// larger image fails them Permanent; a download of one (as the server
	// declares it, or as it streams) leaves nothing in the pool.
	MaxImageBytes int64
	// MaxDownloadsPerHost is how many images download at once to one
	// host; DefaultMaxDownloadsPerHost when 0. More wait their turn.
	MaxDownloadsPerHost int
	// UnusedImageRetention is how long a base image no overlay or domain
	// uses stays before Tidy deletes it; 0 keeps every image.
	UnusedImageRetention time.Duration
	// Guard dials the hosts and the image downloads when they are a
	// tenant's (a namespaced config's); nil for the platform's.
	Guard *netguard.Guard
	// URLGuard dials the download of an image a proxy names by URL, on
	// any config: proxies are written by tenants or composed from their
	// claims. Nil: Guard.
	URLGuard *netguard.Guard
}

// Defaults of the image download limits.
const (
	DefaultMaxImageBytes       = 20 << 30
	DefaultMaxDownloadsPerHost = 2
)

func (c Config) maxImageBytes() int64 {
	if c.MaxImageBytes > 0 {
		return c.MaxImageBytes
	}
	return DefaultMaxImageBytes
}

func (c Config) maxDownloadsPerHost() int {
	if c.MaxDownloadsPerHost > 0 {
		return c.MaxDownloadsPerHost
	}
	return DefaultMaxDownloadsPerHost
}

// Image is one base image.
type Image struct {
	URL      string
	SHA256   string
	Format   string // qcow2 (default) or raw
	Firmware string // bios (default) or uefi
}

// MachineType is one size.
type MachineType struct {
	VCPUs     int32
	MemoryMiB int32
}

// Host is one libvirt host.
type Host struct {
	Name    string
	Address string
	User    string
	Socket  string
	Pool    string
	Bridge  string
	Network string
	// DomainType is kvm (default) or qemu (TCG, for hosts without
	// hardware virtualisation).
	DomainType string
	// Routed says the guests' traffic leaves with their own addresses (no
	// NAT on the host), so a guest's address is its egress address. Behind
	// NAT (libvirt's default network) it is not, and none is published
	// without the egress check.
	Routed bool
}

func (h Host) socket() string { return orDefault(h.Socket, DefaultSocket) }
func (h Host) pool() string   { return orDefault(h.Pool, DefaultPool) }

// Options configure a Backend.
type Options struct {
	// Budgets per call; zero fields take DefaultBudgets.
	Budgets Budgets
	// Tracer for the driver's spans; default telemetry.Tracer().
	Tracer trace.Tracer
	// Log, when set, replaces the logger from each call's context.
	Log *logr.Logger
	// HTTPClient downloads images; default a client without timeout (each
	// download's ctx carries the budget).
	HTTPClient *http.Client
	// Prober checks that Squid with the instance's own configuration
	// answers; default a squid.Prober of its own.
	Prober *squid.Prober
	// Resolver resolves the hosts' names, whose addresses each guest's
	// Squid denies; default net.DefaultResolver.
	Resolver netguard.Resolver

	// dial replaces the SSH dialer (tests).
	dial dialFunc
}

// Backend is the process-wide state every kvm driver shares: pooled
// connections, the per-name and per-image locks, the image cache and the
// creates waiting on it. Build one per process; Driver is cheap.
type Backend struct {
	budgets  Budgets
	tracer   trace.Tracer
	logOpt   *logr.Logger
	http     *http.Client
	pool     *connPool
	prober   *squid.Prober
	resolver netguard.Resolver
	images   *imageCache
	// downloads bounds the image downloads running per host.
	downloads *slots

	names keyedLocks

	// ctx is the background work's; cancelled by Close.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	pending map[string]*pending // by host endpoint + name
	// unused are the base images Tidy found unused, by host endpoint,
	// pool and volume, with when it first did.
	unused map[string]time.Time
	// guarded are the download clients of tenants' images, by guard.
	guarded map[*netguard.Guard]*http.Client
	wg      sync.WaitGroup
}

// NewBackend returns a Backend.
func NewBackend(o Options) *Backend {
	b := &Backend{budgets: o.Budgets.withDefaults(), tracer: o.Tracer, logOpt: o.Log, http: o.HTTPClient, pending: map[string]*pending{}, unused: map[string]time.Time{}}
	if b.tracer == nil {
		b.tracer = telemetry.Tracer()
	}
	if b.http == nil {
		b.http = &http.Client{}
	}
	dial := o.dial
	if dial == nil {
		dial = (&sshDialer{budgets: b.budgets, tracer: b.tracer}).dial
	}
	b.pool = newConnPool(dial, b.tracer, b.logger)
	b.prober = o.Prober
	if b.prober == nil {
		// A booting guest's Squid is probed again at each of the external
		// layer's quick rechecks (about a second apart): a refusal is not
		// kept longer than that.
		b.prober = &squid.Prober{NegativeTTL: 500 * time.Millisecond}
	}
	b.resolver = o.Resolver
	if b.resolver == nil {
		b.resolver = net.DefaultResolver
	}
	b.images = newImageCache()
	b.downloads = newSlots()
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b
}

// Close stops background work and closes pooled connections.
func (b *Backend) Close() {
	b.cancel()
	b.wg.Wait()
	b.pool.close()
}

// logger is the kvm logger of ctx: Options.Log, else the one in ctx (the
// reconcile's, as controller-runtime puts it there), with the instance
// scope of ctx (withInstance) and the trace of ctx's span.
func (b *Backend) logger(ctx context.Context) logr.Logger {
	l := logr.FromContextOrDiscard(ctx)
	if b.logOpt != nil {
		l = *b.logOpt
	}
	l = l.WithName("kvm")
	if s, ok := ctx.Value(scopeKey{}).(instanceScope); ok {
		l = l.WithValues("provider", s.provider, "host", s.host, "name", s.name)
	}
	return telemetry.Logger(ctx, l)
}

// instanceScope is the instance an operation (or the background work it
// started) is about: every kvm line made under it carries the three.
type instanceScope struct{ provider, host, name string }

type scopeKey struct{}

// withInstance scopes ctx to the instance name on host.
func (d *Driver) withInstance(ctx context.Context, host, name string) context.Context {
	return context.WithValue(ctx, scopeKey{}, instanceScope{provider: d.cfg.Name, host: host, name: name})
}

// scoped reports whether ctx's lines already carry provider, host and name.
func scoped(ctx context.Context) bool {
	_, ok := ctx.Value(scopeKey{}).(instanceScope)
	return ok
}

// background is the context of work an operation starts and does not
// wait for (an image download, the rest of a create): it keeps what ctx
// carries (the logger, the instance scope, the operation's span, whose
// child the work's span is) but not its cancellation or deadline, and
// ends when the Backend closes or stop is called.
func (b *Backend) background(ctx context.Context) (bg context.Context, stop context.CancelFunc) {
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	unhook := context.AfterFunc(b.ctx, cancel)
	return bg, func() { unhook(); cancel() }
}

// Driver returns the proxy.Driver of one config.
func (b *Backend) Driver(cfg Config) *Driver {
	return &Driver{b: b, cfg: cfg}
}

// Driver is the kvm proxy.Driver of one config.
type Driver struct {
	b   *Backend
	cfg Config
}

var _ proxy.Driver = (*Driver)(nil)

func (d *Driver) log(ctx context.Context) logr.Logger {
	if scoped(ctx) {
		return d.b.logger(ctx)
	}
	return d.b.logger(ctx).WithValues("provider", d.cfg.Name)
}

// logAbout is log for a line about the instance name on host.
func (d *Driver) logAbout(ctx context.Context, host, name string) logr.Logger {
	if scoped(ctx) {
		return d.b.logger(ctx)
	}
	return d.log(ctx).WithValues("host", host, "name", name)
}

// wrap names the provider and operation on every error leaving the driver.
func (d *Driver) wrap(err error, op string) error {
	return proxy.WithContext(classify(op, err), d.cfg.Name, op)
}

var validName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// host returns the configured host named name; empty means the only one.
// Without one there is nowhere to look (Unresolved).
func (d *Driver) host(name string) (Host, error) {
	if name == "" && len(d.cfg.Hosts) == 1 {
		return d.cfg.Hosts[0], nil
	}
	names := make([]string, 0, len(d.cfg.Hosts))
	for _, h := range d.cfg.Hosts {
		if h.Name == name {
			return h, nil
		}
		names = append(names, h.Name)
	}
	if name == "" {
		return Host{}, proxy.Unresolvedf("placement: a host is required: the config has several (%s)", strings.Join(names, ", "))
	}
	return Host{}, proxy.Unresolvedf("placement: host %q is not in the config's kvm.hosts (%s)", name, strings.Join(names, ", "))
}

// hypervisors are the addresses of every host of the config, which a
// guest's Squid denies: its own host (sshd, libvirtd) and the others,
// which trust the same network and the provider's keys alike.
func (d *Driver) hypervisors(ctx context.Context) ([]string, error) {
	var out []string
	for i, h := range d.cfg.Hosts {
		a, err := cloudinit.HostAddresses(ctx, d.b.resolver, fmt.Sprintf("kvm.hosts[%d].address", i), h.Address)
		if err != nil {
			return nil, err
		}
		out = append(out, a...)
	}
	return out, nil
}

func (d *Driver) target(h Host) Target {
	return Target{Host: h, Creds: d.cfg.Credentials, Guard: d.cfg.Guard, Config: d.cfg.Name}
}

// conn returns the pooled connection to h.
func (d *Driver) conn(ctx context.Context, h Host) (Libvirt, error) {
	return d.b.pool.get(ctx, d.target(h))
}

// markUnused records base image key as unused (returning since when) or,
// with unused false, forgets it.
func (b *Backend) markUnused(key string, unused bool) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !unused {
		delete(b.unused, key)
		return time.Time{}
	}
	since, ok := b.unused[key]
	if !ok {
		since = b.clock()
		b.unused[key] = since
	}
	return since
}

func (b *Backend) clock() time.Time { return time.Now() }
