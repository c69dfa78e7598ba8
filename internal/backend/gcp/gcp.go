// Package gcp is the GCPProxy backend: Squid on a Compute Engine instance,
// driven through Compute Engine's REST API (a client of its own on
// net/http, computeapi's types) behind the API seam.
//
// What one proxy is made of, all named after the instance:
//
//	instance      labels carry the ownership mark (LabelUID,
//	              LabelInstallation) and the spec hash; metadata carries
//	              the cloud-init user-data that installs Squid, merged
//	              with the user's cloudInit, and the current Squid files
//	firewall rule optional (ManageFirewall): TCP to the proxy port from
//	              the allowed client CIDRs, to this instance's tag only
//	address       optional (Static): a reserved regional external
//	              address, the instance's NAT IP and so its egress IP
//
// Every call that starts work returns a Compute Engine operation. Create,
// Update and Delete submit and return; the operations' names travel in
// Instance.Operation (status.atProvider.operation) and Get reads them
// first, so a failure that arrives after the API accepted the request
// (quota, a stockout, a bad image) reaches the managed resource's
// condition with GCP's code instead of being lost. At steady state (no
// operation in flight) Get costs one request: instances.get, which carries
// the status, the NAT IP and the labels.
//
// Delete goes instance, then address, then firewall rule, one step per
// call, each idempotent; before the instance goes, the rule is disabled
// and the address labelled LabelDeleting, so that Get keeps reporting the
// proxy (and the reconciler keeps calling Delete) until both are gone,
// even across a provider restart.
package gcp

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/egressproxy/provider-egressproxy/internal/backend/batch"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Config is the gcp block of a ProviderConfig, resolved.
type Config struct {
	// Project instances are created in.
	Project string
	// Network is the VPC network; default "default".
	Network string
	// Subnetwork in the instance's region; empty for the network's
	// default (auto-mode networks).
	Subnetwork string
	// NetworkTags are put on every instance.
	NetworkTags []string
	// DiskSizeGB of the boot disk; default 10.
	DiskSizeGB int32
	// Images maps catalogue keys to image or image-family URLs.
	Images map[string]string
	// MachineTypes maps catalogue keys to machine types (e2-small).
	MachineTypes map[string]string
	// Zones, when set, are the zones whose regions Check reports quota for.
	Zones []string
	// Endpoint, when set, is the Compute Engine API's base URL (a private
	// endpoint, a fake); it overrides the Connector's.
	Endpoint string
}

func (c Config) withDefaults() Config {
	if c.Network == "" {
		c.Network = "default"
	}
	if c.DiskSizeGB == 0 {
		c.DiskSizeGB = 10
	}
	return c
}

// Options configure a Driver.
type Options struct {
	// Provider is the configured name of the backend (the
	// ProviderConfig's, such as "ClusterProviderConfig gcp-prod"); every
	// error carries it.
	Provider string
	// Config is the resolved gcp block.
	Config Config
	// API is the seam to Compute Engine for Config.Project.
	API API
	// Endpoint is where API goes, for Check's report; default
	// compute.googleapis.com.
	Endpoint string
	// Prober checks that Squid with the instance's own configuration
	// answers; default one of the driver's own (a Connector shares its
	// own among the drivers it builds).
	Prober *squid.Prober
	// UserData renders the user-data; default cloudinit.UserData without
	// the guest agent (Compute Engine reports addresses itself).
	UserData func(o cloudinit.Options) (string, error)
	// FailedOperationHold is how long a failed operation keeps being
	// reported before the driver lets Create try again; Permanent
	// failures are held ten times as long. Default one minute.
	FailedOperationHold time.Duration
	// Log, when set, receives the driver's log lines; otherwise they go to
	// the logger in the call's context.
	Log *logr.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time

	// ObserveMaxAge bounds the age of the shared listing a steady
	// instance's Get is answered from (batch.go); zero means
	// batch.DefaultMaxAge. A Connector's pooled drivers use its own.
	ObserveMaxAge time.Duration

	// pending and batch are shared by the drivers of one pooled connection.
	pending *pendingOps
	batch   *observeBatch
	// quiet: the key is a tenant's; its token endpoint's answers are not
	// quoted in errors.
	quiet bool
	// guard checks and dials the instances' addresses for the readiness
	// probe (a tenant's key: its project's addresses are the tenant's to
	// choose); nil otherwise.
	guard *netguard.Guard
}

// Driver is the gcp proxy.Driver.
type Driver struct {
	o   Options
	cfg Config
	api API
}

var _ proxy.Driver = (*Driver)(nil)

// New returns a driver for o.
func New(o Options) *Driver {
	if o.Prober == nil {
		o.Prober = &squid.Prober{}
	}
	if o.UserData == nil {
		o.UserData = cloudinit.UserData
	}
	if o.FailedOperationHold <= 0 {
		o.FailedOperationHold = time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Endpoint == "" {
		o.Endpoint = "compute.googleapis.com"
	}
	if o.pending == nil {
		o.pending = &pendingOps{}
	}
	if o.batch == nil {
		o.batch = newObserveBatch(o.ObserveMaxAge)
	}
	return &Driver{o: o, cfg: o.Config.withDefaults(), api: o.API}
}

// pendingOps remembers operations submitted, per instance, for the life
// of a pooled connection.
//
// Delete cannot hand an operation back to the controller, and must neither
// submit a second deletion while the first runs nor lose its outcome (ops).
//
// Create hands its operations back in Instance.Operation, but
// crossplane-runtime drops status changes made by Create (it re-reads the
// object when it records the creation annotations), so Get also follows
// the operations remembered here (followed) until an Observe has written
// them into status.atProvider.operation.
type pendingOps struct {
	ops      batch.Map[string, OpRef]
	mu       sync.Mutex
	followed map[string][]OpRef
}

// remember adds operations Get must follow for the instance key.
func (p *pendingOps) remember(key string, ops []OpRef) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.followed == nil {
		p.followed = map[string][]OpRef{}
	}
	for _, o := range ops {
		if !slices.Contains(p.followed[key], o) {
			p.followed[key] = append(p.followed[key], o)
		}
	}
}

// toFollow is ops plus the remembered operations of key, without repeats.
func (p *pendingOps) toFollow(key string, ops []OpRef) []OpRef {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := slices.Clone(ops)
	for _, o := range p.followed[key] {
		if !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	return out
}

// followedUpTo keeps only the remembered operations still in flight.
func (p *pendingOps) followedUpTo(key string, inflight []OpRef) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var keep []OpRef
	for _, o := range p.followed[key] {
		if slices.Contains(inflight, o) {
			keep = append(keep, o)
		}
	}
	if len(keep) == 0 {
		delete(p.followed, key)
		return
	}
	p.followed[key] = keep
}

func (d *Driver) log(ctx context.Context) logr.Logger {
	l := logr.FromContextOrDiscard(ctx)
	if d.o.Log != nil {
		l = *d.o.Log
	}
	return telemetry.Logger(ctx, l.WithName("gcp").WithValues("provider", d.o.Provider))
}

// wrap classifies err and names the provider and the operation.
func (d *Driver) wrap(err error, op string) error {
	return proxy.WithContext(classify(d.quietly(err)), d.o.Provider, op)
}

// quietly is err without what a tenant's token endpoint answered
// (quietAuth) for a tenant's key; err itself otherwise.
func (d *Driver) quietly(err error) error {
	if d.o.quiet {
		return quietAuth(err)
	}
	return err
}

// --- IDs ---

// ID is zones/<zone>/instances/<name>; the project comes from the config.
func ID(zone, name string) string { return "zones/" + zone + "/instances/" + name }

func parseID(id string) (zone, name string, ok bool) {
	p := strings.Split(id, "/")
	if len(p) != 4 || p[0] != "zones" || p[2] != "instances" || !zoneRE.MatchString(p[1]) || !nameRE.MatchString(p[3]) {
		return "", "", false
	}
	return p[1], p[3], true
}

// resolve returns the zone and name a Ref points at: its ID when it has
// one (a malformed one is Permanent, never resolved by name), else its
// name in its placement; without a zone there is nowhere to look
// (Unresolved).
func (d *Driver) resolve(ref proxy.Ref) (string, string, error) {
	if ref.ID != "" {
		zone, name, ok := parseID(ref.ID)
		if !ok {
			return "", "", proxy.Permanentf("malformed instance ID %q: want zones/<zone>/instances/<name>", ref.ID)
		}
		return zone, name, nil
	}
	if !nameRE.MatchString(ref.Name) {
		return "", "", proxy.Permanentf("reference has no ID and an invalid instance name %q", ref.Name)
	}
	if !zoneRE.MatchString(ref.Placement.Location) {
		return "", "", proxy.Unresolvedf("reference has no ID and no valid zone (%q)", ref.Placement.Location)
	}
	return ref.Placement.Location, ref.Name, nil
}
