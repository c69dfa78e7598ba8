// Package gcp is the GCPProxy backend: Squid on a Compute Engine instance,
// driven through the SDK's REST clients (cloud.google.com/go/compute)
// behind the API seam.
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
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Driver operations, as they appear in (*proxy.Error).Op.
const (
	opCreate = "create"
	opGet    = "get"
	opUpdate = "update"
	opDelete = "delete"
	opList   = "list"
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
	// Probe reports whether the proxy answers on addr (host:port);
	// default DialProbe.
	Probe func(ctx context.Context, addr string) bool
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

	// pending is shared by the drivers of one pooled connection.
	pending *pendingOps
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
	if o.Probe == nil {
		o.Probe = DialProbe
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
		o.pending = &pendingOps{ops: map[string]OpRef{}}
	}
	return &Driver{o: o, cfg: o.Config.withDefaults(), api: o.API}
}

// DialProbe is the default readiness probe: a TCP connect within two
// seconds.
func DialProbe(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
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
	mu       sync.Mutex
	ops      map[string]OpRef
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

func (p *pendingOps) get(key string) (OpRef, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.ops[key]
	return o, ok
}

func (p *pendingOps) set(key string, o OpRef) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ops[key] = o
}

func (p *pendingOps) forget(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.ops, key)
}

func (d *Driver) log(ctx context.Context) logr.Logger {
	l := logr.FromContextOrDiscard(ctx)
	if d.o.Log != nil {
		l = *d.o.Log
	}
	return l.WithName("gcp").WithValues("provider", d.o.Provider)
}

// fail gives err its class (unless it has one), the provider and op.
func (d *Driver) fail(ctx context.Context, op string, err error) error {
	err = classify(err)
	if op == opCreate {
		// A 404 to the insert or to the address or firewall it needs
		// names an image, network, subnetwork or zone that does not exist.
		err = proxy.MissingOnCreate(err)
	}
	err = proxy.WithContext(err, d.o.Provider, op)
	d.log(ctx).V(1).Info("call failed", "op", op, "class", string(proxy.ClassOf(err)), "error", err.Error())
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
// name in its placement.
func (d *Driver) resolve(ctx context.Context, op string, ref proxy.Ref) (string, string, error) {
	if ref.ID != "" {
		zone, name, ok := parseID(ref.ID)
		if !ok {
			return "", "", d.fail(ctx, op, proxy.Permanentf("malformed instance ID %q: want zones/<zone>/instances/<name>", ref.ID))
		}
		return zone, name, nil
	}
	if !nameRE.MatchString(ref.Name) {
		return "", "", d.fail(ctx, op, proxy.Permanentf("reference has no ID and an invalid instance name %q", ref.Name))
	}
	if !zoneRE.MatchString(ref.Placement.Location) {
		return "", "", d.fail(ctx, op, proxy.Permanentf("reference has no ID and no valid zone (%q)", ref.Placement.Location))
	}
	return ref.Placement.Location, ref.Name, nil
}

// resolveSpec checks req against the config's catalogues and renders what
// the instance runs. Its errors are Permanent and name the field.
func (d *Driver) resolveSpec(req proxy.Request) (*spec, error) {
	switch {
	case !nameRE.MatchString(req.Name):
		return nil, proxy.Permanentf("invalid instance name %q: want lowercase letters, digits and dashes, at most 63", req.Name)
	case req.Mark.UID == "" || req.Mark.InstallationID == "":
		return nil, proxy.Permanentf("request for %q carries no complete ownership mark", req.Name)
	case !labelRE.MatchString(req.Mark.UID) || !labelRE.MatchString(req.Mark.InstallationID):
		return nil, proxy.Permanentf("ownership mark of %q is not a valid label value", req.Name)
	case !zoneRE.MatchString(req.Placement.Location):
		return nil, proxy.Permanentf("zone %q is not a Compute Engine zone such as europe-west1-b", req.Placement.Location)
	}
	s := &spec{zone: req.Placement.Location, region: regionOf(req.Placement.Location), req: req, addressType: req.Exposure.AddressType}
	if s.addressType == "" {
		s.addressType = AddressEphemeral
	}
	switch s.addressType {
	case AddressEphemeral, AddressStatic, AddressInternal:
	default:
		return nil, proxy.Permanentf("address type %q: want Ephemeral, Static or Internal", s.addressType)
	}
	var ok bool
	if s.machineType, ok = d.cfg.MachineTypes[req.Placement.MachineType]; !ok {
		return nil, proxy.Permanentf("machine type %q is not in %s: want one of %s", req.Placement.MachineType, d.o.Provider, keys(d.cfg.MachineTypes))
	}
	if s.image, ok = d.cfg.Images[req.Placement.Image]; !ok {
		return nil, proxy.Permanentf("image %q is not in %s: want one of %s", req.Placement.Image, d.o.Provider, keys(d.cfg.Images))
	}
	if req.Exposure.ManageFirewall && len(firewallSources(req.Proxy.AllowedClientCIDRs)) == 0 {
		return nil, proxy.Permanentf("the firewall rule needs at least one IPv4 client CIDR: the proxy's network interface is IPv4 only")
	}
	if err := validLabels(req.Labels); err != nil {
		return nil, err
	}
	files, err := squid.Render(req.Proxy, cloudinit.SquidOptions(req.Mark.UID))
	if err != nil {
		return nil, err
	}
	s.squidConf, s.htpasswd = files.SquidConf, files.Htpasswd
	if s.userData, err = d.o.UserData(cloudinit.Options{Squid: files, UserData: req.CloudInit, Hostname: req.Name}); err != nil {
		return nil, proxy.Classify(proxy.ClassPermanent, err)
	}
	return s, nil
}

func keys[V any](m map[string]V) string {
	return strings.Join(slices.Sorted(maps.Keys(m)), ", ")
}

// --- proxy.Driver ---

// Create implements proxy.Driver. Each step is idempotent and resumable:
// the firewall rule and the static address are ensured first (a Static
// proxy returns after submitting the reservation, whose address the
// instance needs), then the instance is inserted; nothing waits.
func (d *Driver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	s, err := d.resolveSpec(req)
	if err != nil {
		return proxy.Instance{}, d.fail(ctx, opCreate, err)
	}
	inst, err := d.api.GetInstance(ctx, s.zone, req.Name)
	switch {
	case err == nil:
		return d.adopt(ctx, opCreate, inst, req)
	case !isNotFound(err):
		return proxy.Instance{}, d.fail(ctx, opCreate, err)
	}
	var ops []OpRef
	placeholder := func(progress string) proxy.Instance {
		return proxy.Instance{
			ID: ID(s.zone, req.Name), Name: req.Name, Mark: req.Mark, State: proxy.StateProvisioning,
			Placement: req.Placement, Progress: progress, Operation: joinOps(ops), SpecHash: proxy.Hash(req),
		}
	}
	if req.Exposure.ManageFirewall {
		op, err := d.ensureFirewall(ctx, req, ProxyTag(req))
		if err != nil {
			return proxy.Instance{}, d.fail(ctx, opCreate, err)
		}
		ops = appendOp(ops, op)
	}
	natIP := ""
	if s.addressType == AddressStatic {
		ip, op, err := d.ensureAddress(ctx, s.region, req)
		if err != nil {
			return proxy.Instance{}, d.fail(ctx, opCreate, err)
		}
		if ip == "" {
			ops = appendOp(ops, op)
			d.o.pending.remember(opsKey(s.zone, req.Name), ops)
			return placeholder("reserving static address " + req.Name + " in " + s.region), nil
		}
		ops, natIP = appendOp(ops, op), ip
	}
	op, err := d.api.InsertInstance(ctx, s.zone, buildInstance(d.cfg, s, natIP))
	switch {
	case isAlreadyExists(err):
		// Created since the read above (a concurrent reconcile): read it,
		// and adopt it only if it is ours.
		inst, err := d.api.GetInstance(ctx, s.zone, req.Name)
		if err != nil {
			return proxy.Instance{}, d.fail(ctx, opCreate, err)
		}
		return d.adopt(ctx, opCreate, inst, req)
	case err != nil:
		return proxy.Instance{}, d.fail(ctx, opCreate, err)
	}
	ops = append(ops, opRefOf(op))
	d.o.pending.remember(opsKey(s.zone, req.Name), ops)
	d.log(ctx).Info("inserting instance", "id", ID(s.zone, req.Name), "operation", opRefOf(op).String(),
		"machineType", s.machineType, "image", s.image, "address", s.addressType, "firewall", req.Exposure.ManageFirewall)
	return placeholder("creating instance"), nil
}

// adopt returns an existing instance found by Create if it is ours, and
// refuses (Permanent) one that is not.
func (d *Driver) adopt(ctx context.Context, op string, inst *computepb.Instance, req proxy.Request) (proxy.Instance, error) {
	if m := markOf(inst.GetLabels()); m != req.Mark {
		return proxy.Instance{}, d.fail(ctx, op, proxy.Permanentf("instance %q already exists and is not this resource's (%s); refusing to adopt it", req.Name, describeMark(m)))
	}
	return d.view(ctx, inst, false), nil
}

func describeMark(m proxy.Mark) string {
	if m == (proxy.Mark{}) {
		return "no ownership mark"
	}
	return fmt.Sprintf("UID %q, installation %q", m.UID, m.InstallationID)
}

func appendOp(ops []OpRef, op *OpRef) []OpRef {
	if op == nil {
		return ops
	}
	return append(ops, *op)
}

// firewallTarget is the tag inst's rule targets: ProxyTag, or on an
// instance created before proxies had tags of their own (and so without
// it), the instance's name, which it carries as its tag: its rule keeps
// reaching it until it is recreated.
func firewallTarget(inst *computepb.Instance, req proxy.Request) string {
	tags := inst.GetTags().GetItems()
	if own := ProxyTag(req); slices.Contains(tags, own) || !slices.Contains(tags, req.Name) {
		return own
	}
	return req.Name
}

// ensureFirewall creates the proxy's rule or brings it up to date; it
// refuses a rule of the same name that is not this proxy's, and never
// writes a rule without source ranges (Compute Engine reads that as
// 0.0.0.0/0).
func (d *Driver) ensureFirewall(ctx context.Context, req proxy.Request, target string) (*OpRef, error) {
	want := buildFirewall(d.cfg, req, target)
	if len(want.GetSourceRanges()) == 0 {
		return nil, proxy.Permanentf("the firewall rule needs at least one IPv4 client CIDR (a rule without source ranges would admit 0.0.0.0/0)")
	}
	fw, err := d.api.GetFirewall(ctx, req.Name)
	switch {
	case isNotFound(err):
		op, err := d.api.InsertFirewall(ctx, want)
		if isAlreadyExists(err) {
			return nil, proxy.Transientf("firewall rule %q was created concurrently; will read it again", req.Name)
		}
		if err != nil {
			return nil, fmt.Errorf("inserting firewall rule %q: %w", req.Name, classify(err))
		}
		o := opRefOf(op)
		return &o, nil
	case err != nil:
		return nil, fmt.Errorf("reading firewall rule %q: %w", req.Name, classify(err))
	}
	if m, ok := firewallMark(fw); !ok || m != req.Mark {
		return nil, proxy.Permanentf("firewall rule %q already exists and is not this proxy's (%s); refusing to take it over", req.Name, describeMark(m))
	}
	if firewallCurrent(fw, want) {
		return nil, nil
	}
	op, err := d.api.PatchFirewall(ctx, req.Name, want)
	if err != nil {
		return nil, fmt.Errorf("updating firewall rule %q: %w", req.Name, classify(err))
	}
	o := opRefOf(op)
	return &o, nil
}

// ensureAddress reserves the proxy's static address. It returns the
// address once reserved; until then "" and, when it just submitted the
// reservation, its operation.
func (d *Driver) ensureAddress(ctx context.Context, region string, req proxy.Request) (string, *OpRef, error) {
	a, err := d.api.GetAddress(ctx, region, req.Name)
	switch {
	case isNotFound(err):
		op, err := d.api.InsertAddress(ctx, region, buildAddress(req, region))
		if err != nil && !isAlreadyExists(err) {
			return "", nil, fmt.Errorf("reserving address %q: %w", req.Name, classify(err))
		}
		if err != nil {
			return "", nil, nil
		}
		o := opRefOf(op)
		d.log(ctx).Info("reserving static address", "address", req.Name, "region", region, "operation", o.String())
		return "", &o, nil
	case err != nil:
		return "", nil, fmt.Errorf("reading address %q: %w", req.Name, classify(err))
	}
	if m := markOf(a.GetLabels()); m != req.Mark {
		return "", nil, proxy.Permanentf("address %q already exists in %s and is not this proxy's (%s); refusing to take it over", req.Name, region, describeMark(m))
	}
	if a.GetLabels()[LabelDeleting] == "true" {
		return "", nil, proxy.Transientf("address %q is being released; will reserve it again once it is gone", req.Name)
	}
	return a.GetAddress(), nil, nil
}

// Get implements proxy.Driver. It reads the operations in ref.Operation
// first (one request each, only while some are in flight or failed), then
// the instance (one request). A failed operation is reported, with GCP's
// code, for FailedOperationHold after it ended; then it is dropped, Get
// says NotFound, and the controller creates again.
func (d *Driver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	zone, name, err := d.resolve(ctx, opGet, ref)
	if err != nil {
		return proxy.Instance{}, err
	}
	key := opsKey(zone, name)
	inflight, progress, err := d.follow(ctx, d.o.pending.toFollow(key, splitOps(ref.Operation)))
	if err != nil {
		return proxy.Instance{}, d.fail(ctx, opGet, err)
	}
	d.o.pending.followedUpTo(key, inflight)
	inst, err := d.api.GetInstance(ctx, zone, name)
	switch {
	case err == nil:
		v := d.view(ctx, inst, true)
		v.Operation = joinOps(inflight)
		if v.Progress == "" {
			v.Progress = progress
		}
		return v, nil
	case !isNotFound(err):
		return proxy.Instance{}, d.fail(ctx, opGet, err)
	}
	if len(inflight) > 0 {
		// Accepted and not done: never NotFound, or the controller would
		// create a second time.
		return proxy.Instance{
			ID: ID(zone, name), Name: name, Mark: ref.Mark, State: proxy.StateProvisioning,
			Placement: ref.Placement, Progress: progress, Operation: joinOps(inflight),
		}, nil
	}
	if ref.ID != "" {
		left, err := d.leftovers(ctx, zone, name, ref.Mark)
		if err != nil {
			return proxy.Instance{}, d.fail(ctx, opGet, err)
		}
		if left != "" {
			return proxy.Instance{ID: ID(zone, name), Name: name, Mark: ref.Mark, State: proxy.StateStopped, Placement: ref.Placement, Progress: left}, nil
		}
	}
	return proxy.Instance{}, d.fail(ctx, opGet, proxy.NotFoundf("instance %q not found in zone %s", name, zone))
}

// follow reads operations: it returns those still running and a progress
// line, and the error of one that failed within the hold.
func (d *Driver) follow(ctx context.Context, ops []OpRef) ([]OpRef, string, error) {
	var inflight []OpRef
	var progress []string
	for _, o := range ops {
		op, err := d.api.GetOperation(ctx, o)
		if isNotFound(err) {
			continue // operations are garbage-collected after a while
		}
		if err != nil {
			return nil, "", fmt.Errorf("reading operation %s: %w", o, classify(err))
		}
		if op.GetStatus() != computepb.Operation_DONE {
			inflight = append(inflight, o)
			progress = append(progress, fmt.Sprintf("%s %s: %s %d%%", op.GetOperationType(), lastSegment(op.GetTargetLink()), op.GetStatus(), op.GetProgress()))
			continue
		}
		oe := operationError(o.String(), op)
		if oe == nil || oe.alreadyExists() {
			continue
		}
		ferr := classifyOperation(oe)
		hold := d.o.FailedOperationHold
		if proxy.IsPermanent(ferr) {
			hold *= 10
		}
		if oe.Ended.IsZero() || d.o.Now().Sub(oe.Ended) < hold {
			return nil, "", ferr
		}
		d.log(ctx).V(1).Info("dropping a failed operation past its hold", "operation", o.String(), "error", oe.Error())
	}
	return inflight, strings.Join(progress, "; "), nil
}

// leftovers says what of a deleted instance is still being removed: a
// disabled rule of ours, or a static address labelled LabelDeleting; ""
// when nothing is. It is read only when the instance is gone and the
// resource had one, so steady state never pays for it.
func (d *Driver) leftovers(ctx context.Context, zone, name string, mark proxy.Mark) (string, error) {
	fw, err := d.api.GetFirewall(ctx, name)
	switch {
	case err == nil:
		if m, ok := firewallMark(fw); ok && fw.GetDisabled() && (mark.UID == "" || m.UID == mark.UID) {
			return "deleting: firewall rule " + name + " remains", nil
		}
	case !isNotFound(err):
		return "", fmt.Errorf("reading firewall rule %q: %w", name, classify(err))
	}
	a, err := d.api.GetAddress(ctx, regionOf(zone), name)
	switch {
	case err == nil:
		l := a.GetLabels()
		if l[LabelDeleting] == "true" && (mark.UID == "" || l[LabelUID] == mark.UID) {
			return "deleting: releasing static address " + name, nil
		}
	case !isNotFound(err):
		return "", fmt.Errorf("reading address %q: %w", name, classify(err))
	}
	return "", nil
}

// view maps an instance onto proxy.Instance; probe checks the proxy port
// when the instance is running with an address.
func (d *Driver) view(ctx context.Context, inst *computepb.Instance, probe bool) proxy.Instance {
	zone := lastSegment(inst.GetZone())
	labels := inst.GetLabels()
	v := proxy.Instance{
		ID:       ID(zone, inst.GetName()),
		Name:     inst.GetName(),
		Mark:     markOf(labels),
		SpecHash: labels[LabelSpec],
		Placement: proxy.Placement{
			Location: zone, MachineType: labels[LabelMachineType], Image: labels[LabelImage],
		},
		Details: map[string]string{},
	}
	if t, err := time.Parse(time.RFC3339Nano, inst.GetCreationTimestamp()); err == nil {
		v.CreatedAt = t.UTC()
	}
	var natIP, internalIP string
	if nics := inst.GetNetworkInterfaces(); len(nics) > 0 {
		internalIP = nics[0].GetNetworkIP()
		for _, ac := range nics[0].GetAccessConfigs() {
			if ac.GetNatIP() != "" {
				natIP = ac.GetNatIP()
				break
			}
		}
	}
	v.IP, v.EgressIP = natIP, natIP
	if labels[LabelAddress] == "internal" {
		// Clients reach the internal address; traffic leaves through
		// whatever the network routes (Cloud NAT), unknown here.
		v.IP, v.EgressIP = internalIP, ""
	}
	if internalIP != "" {
		v.Details["networkIP"] = internalIP
	}
	if a := labels[LabelAddress]; a != "" {
		v.Details["addressType"] = a
	}
	v.Details["status"] = inst.GetStatus()
	v.State = mapState(inst.GetStatus(), v.IP)
	if _, deleting := d.o.pending.get(deleteKey(zone, inst.GetName())); deleting {
		v.Progress = "deleting"
		if v.State == proxy.StateRunning {
			v.State = proxy.StateStopped
		}
	}
	if probe && v.State == proxy.StateRunning && v.Progress == "" {
		port := labels[LabelPort]
		if _, err := strconv.Atoi(port); err == nil {
			v.ProxyReachable = d.o.Probe(ctx, net.JoinHostPort(v.IP, port))
		}
	}
	return v
}

// mapState maps an instance status; RUNNING needs an address.
//
//	PROVISIONING, STAGING, REPAIRING           Provisioning
//	RUNNING without an address                 Provisioning
//	RUNNING with one                           Running
//	STOPPING, STOPPED, SUSPENDING, SUSPENDED,
//	TERMINATED, anything else                  Stopped
//
// TERMINATED is Compute Engine's word for a stopped VM (it can be started
// again), so it is Stopped, not Terminated.
func mapState(status, ip string) proxy.State {
	switch status {
	case "PROVISIONING", "STAGING", "REPAIRING":
		return proxy.StateProvisioning
	case "RUNNING":
		if ip == "" {
			return proxy.StateProvisioning
		}
		return proxy.StateRunning
	}
	return proxy.StateStopped
}

// Update implements proxy.Driver: the firewall rule (created, patched or,
// when no longer managed, removed), the static address's retain label, and
// the instance's labels and metadata in one instances.update. When the
// Squid files changed the update restarts the VM, whose startup script
// installs them from metadata (cloud-init runs once).
func (d *Driver) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	zone, name, err := d.resolve(ctx, opUpdate, ref)
	if err != nil {
		return proxy.Instance{}, err
	}
	req.Name = name
	req.Placement.Location = zone
	s, err := d.resolveSpec(req)
	if err != nil {
		return proxy.Instance{}, d.fail(ctx, opUpdate, err)
	}
	inst, err := d.api.GetInstance(ctx, zone, name)
	if err != nil {
		return proxy.Instance{}, d.fail(ctx, opUpdate, err)
	}
	if m := markOf(inst.GetLabels()); m != req.Mark {
		return proxy.Instance{}, d.fail(ctx, opUpdate, proxy.Permanentf("instance %q is not this resource's (%s); refusing to update it", name, describeMark(m)))
	}
	var ops []OpRef
	if req.Exposure.ManageFirewall {
		op, err := d.ensureFirewall(ctx, req, firewallTarget(inst, req))
		if err != nil {
			return proxy.Instance{}, d.fail(ctx, opUpdate, err)
		}
		ops = appendOp(ops, op)
	} else {
		op, err := d.dropFirewall(ctx, name, req.Mark, false)
		if err != nil {
			return proxy.Instance{}, d.fail(ctx, opUpdate, err)
		}
		ops = appendOp(ops, op)
	}
	if s.addressType == AddressStatic {
		op, err := d.setAddressLabels(ctx, s.region, name, req.Mark, func(l map[string]string) {
			l[LabelRetain] = strconv.FormatBool(req.Exposure.RetainAddress)
		})
		if err != nil {
			return proxy.Instance{}, d.fail(ctx, opUpdate, err)
		}
		ops = appendOp(ops, op)
	}

	oldMD := metadataMap(inst.GetMetadata())
	md := merged(oldMD, s.metadata())
	// cloud-init ran at first boot with the user-data it had; keeping it
	// keeps the instance as created (cloudInit is immutable anyway).
	if ud, ok := oldMD[MetadataUserData]; ok {
		md[MetadataUserData] = ud
	}
	restart := oldMD[MetadataSquidConf] != s.squidConf || oldMD[MetadataHtpasswd] != s.htpasswd
	labels := s.labels()
	if restart || !maps.Equal(inst.GetLabels(), labels) || !maps.Equal(oldMD, md) {
		upd := proto.Clone(inst).(*computepb.Instance) //nolint:forcetypeassert // Clone keeps the type.
		upd.Labels = labels
		upd.Metadata = &computepb.Metadata{Fingerprint: inst.GetMetadata().Fingerprint, Items: metadataItems(md)}
		action := "NO_EFFECT"
		if restart {
			action = "RESTART"
		}
		op, err := d.api.UpdateInstance(ctx, zone, upd, action)
		if err != nil {
			return proxy.Instance{}, d.fail(ctx, opUpdate, fmt.Errorf("updating instance %q: %w", name, classify(err)))
		}
		ops = append(ops, opRefOf(op))
		d.log(ctx).Info("updating instance", "id", ID(zone, name), "operation", opRefOf(op).String(), "restart", restart)
		inst = upd
	}
	d.o.pending.remember(opsKey(zone, name), ops)
	v := d.view(ctx, inst, false)
	v.Operation = joinOps(ops)
	if len(ops) > 0 {
		v.Progress = "updating"
	}
	return v, nil
}

// merged is a copy of a with b's entries over it.
func merged(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, b)
	return out
}

// setAddressLabels changes an address's labels when it exists and is
// ours; a missing or foreign address is left alone.
func (d *Driver) setAddressLabels(ctx context.Context, region, name string, mark proxy.Mark, change func(map[string]string)) (*OpRef, error) {
	a, err := d.api.GetAddress(ctx, region, name)
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading address %q: %w", name, classify(err))
	}
	if m := markOf(a.GetLabels()); m.UID == "" || (mark.UID != "" && !ownedBy(m, mark)) {
		return nil, nil
	}
	labels := merged(a.GetLabels(), nil)
	change(labels)
	if maps.Equal(labels, a.GetLabels()) {
		return nil, nil
	}
	op, err := d.api.SetAddressLabels(ctx, region, name, a.GetLabelFingerprint(), labels)
	if err != nil {
		return nil, fmt.Errorf("labelling address %q: %w", name, classify(err))
	}
	o := opRefOf(op)
	return &o, nil
}

// dropFirewall deletes (or, with disableOnly, disables) the proxy's rule
// when it exists and is ours.
func (d *Driver) dropFirewall(ctx context.Context, name string, mark proxy.Mark, disableOnly bool) (*OpRef, error) {
	fw, err := d.api.GetFirewall(ctx, name)
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading firewall rule %q: %w", name, classify(err))
	}
	m, ok := firewallMark(fw)
	if !ok || (mark.UID != "" && !ownedBy(m, mark)) || (mark.UID == "" && !fw.GetDisabled()) {
		return nil, nil
	}
	var op *computepb.Operation
	if disableOnly {
		if fw.GetDisabled() {
			return nil, nil
		}
		op, err = d.api.PatchFirewall(ctx, name, &computepb.Firewall{Disabled: proto.Bool(true)})
	} else {
		op, err = d.api.DeleteFirewall(ctx, name)
	}
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("removing firewall rule %q: %w", name, classify(err))
	}
	o := opRefOf(op)
	return &o, nil
}

// ownedBy reports whether an object marked m belongs to the resource
// marked want: the same UID and, when want names one, the same
// installation (two installations sharing a project never touch each
// other's objects, even for a UID they share).
func ownedBy(m, want proxy.Mark) bool {
	return m.UID == want.UID && (want.InstallationID == "" || m.InstallationID == want.InstallationID)
}

func deleteKey(zone, name string) string { return "delete/" + zone + "/" + name }

func opsKey(zone, name string) string { return "ops/" + zone + "/" + name }

// Delete implements proxy.Driver, one step per call: the instance (after
// marking the rule and the address, so Get keeps reporting the proxy),
// then the static address unless retained, then the firewall rule. Each
// step's operation is followed; a step that is running returns nil, and
// the controller, seeing the proxy still there, calls again.
func (d *Driver) Delete(ctx context.Context, ref proxy.Ref) error {
	zone, name, err := d.resolve(ctx, opDelete, ref)
	if err != nil {
		return err
	}
	key := deleteKey(zone, name)
	if wait, err := d.pendingStep(ctx, key); err != nil || wait {
		if err != nil {
			return d.fail(ctx, opDelete, err)
		}
		return nil
	}
	inst, err := d.api.GetInstance(ctx, zone, name)
	switch {
	case err == nil:
		m := markOf(inst.GetLabels())
		switch {
		case m == (proxy.Mark{}):
			return d.fail(ctx, opDelete, proxy.Permanentf("instance %q carries no ownership mark; refusing to delete it", name))
		case ref.Mark.UID != "" && !ownedBy(m, ref.Mark):
			return d.fail(ctx, opDelete, proxy.Permanentf("instance %q is not this resource's (%s); refusing to delete it", name, describeMark(m)))
		}
		if _, err := d.dropFirewall(ctx, name, m, true); err != nil {
			return d.fail(ctx, opDelete, err)
		}
		if _, err := d.setAddressLabels(ctx, regionOf(zone), name, m, func(l map[string]string) {
			if l[LabelRetain] != "true" {
				l[LabelDeleting] = "true"
			}
		}); err != nil {
			return d.fail(ctx, opDelete, err)
		}
		op, err := d.api.DeleteInstance(ctx, zone, name)
		switch {
		case isNotFound(err):
			return nil
		case err != nil:
			return d.fail(ctx, opDelete, fmt.Errorf("deleting instance %q: %w", name, classify(err)))
		}
		d.o.pending.set(key, opRefOf(op))
		d.log(ctx).Info("deleting instance", "id", ID(zone, name), "operation", opRefOf(op).String())
		return nil
	case !isNotFound(err):
		return d.fail(ctx, opDelete, err)
	}

	// The instance is gone: the address, then the rule.
	a, err := d.api.GetAddress(ctx, regionOf(zone), name)
	switch {
	case err == nil:
		l := a.GetLabels()
		ours := l[LabelUID] != "" && ((ref.Mark.UID != "" && ownedBy(markOf(l), ref.Mark)) || (ref.Mark.UID == "" && l[LabelDeleting] == "true"))
		if ours && l[LabelRetain] != "true" {
			op, err := d.api.DeleteAddress(ctx, regionOf(zone), name)
			switch {
			case isNotFound(err):
			case err != nil:
				return d.fail(ctx, opDelete, fmt.Errorf("releasing address %q: %w", name, classify(err)))
			default:
				d.o.pending.set(key, opRefOf(op))
				d.log(ctx).Info("releasing static address", "address", name, "operation", opRefOf(op).String())
				return nil
			}
		}
	case !isNotFound(err):
		return d.fail(ctx, opDelete, fmt.Errorf("reading address %q: %w", name, classify(err)))
	}
	mark := ref.Mark
	op, err := d.dropFirewall(ctx, name, mark, false)
	if err != nil {
		return d.fail(ctx, opDelete, err)
	}
	if op != nil {
		d.o.pending.set(key, *op)
		d.log(ctx).Info("deleting firewall rule", "firewall", name, "operation", op.String())
	}
	return nil
}

// pendingStep follows the delete step in flight for key: wait is true
// while it runs; a failure is returned (and forgotten, so the next call
// tries again).
func (d *Driver) pendingStep(ctx context.Context, key string) (wait bool, err error) {
	o, ok := d.o.pending.get(key)
	if !ok {
		return false, nil
	}
	op, err := d.api.GetOperation(ctx, o)
	switch {
	case isNotFound(err):
		d.o.pending.forget(key)
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading operation %s: %w", o, classify(err))
	case op.GetStatus() != computepb.Operation_DONE:
		return true, nil
	}
	d.o.pending.forget(key)
	if oe := operationError(o.String(), op); oe != nil {
		return false, classifyOperation(oe)
	}
	return false, nil
}

// List implements proxy.Driver: the aggregated listing filtered on the
// installation label, every page. A zone that did not answer
// (unreachables) fails the whole list, Transient: a partial list would
// look like instances had vanished.
func (d *Driver) List(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	if installationID == "" || !labelRE.MatchString(installationID) {
		return nil, d.fail(ctx, opList, proxy.Permanentf("invalid installation ID %q", installationID))
	}
	filter := fmt.Sprintf("labels.%s = %q", LabelInstallation, installationID)
	out := []proxy.Instance{}
	token := ""
	for {
		page, err := d.api.AggregatedInstances(ctx, filter, 500, token)
		if err != nil {
			return nil, d.fail(ctx, opList, err)
		}
		if u := page.GetUnreachables(); len(u) > 0 {
			return nil, d.fail(ctx, opList, proxy.Transientf("the listing could not reach %s", strings.Join(u, ", ")))
		}
		for _, scope := range slices.Sorted(maps.Keys(page.GetItems())) {
			for _, inst := range page.GetItems()[scope].GetInstances() {
				if markOf(inst.GetLabels()).InstallationID != installationID {
					continue // the filter should have; never trust it with GC
				}
				out = append(out, d.view(ctx, inst, false))
			}
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	slices.SortFunc(out, func(a, b proxy.Instance) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
