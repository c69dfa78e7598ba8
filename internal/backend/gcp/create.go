package gcp

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

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
	s := &spec{zone: req.Placement.Location, region: regionOf(req.Placement.Location), req: req, addressType: exposureOf(req).AddressType}
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
	if exposureOf(req).ManageFirewall && len(firewallSources(req.Proxy.AllowedClientCIDRs)) == 0 {
		return nil, proxy.Permanentf("spec.forProvider.proxy.allowedClientCIDRs holds no IPv4 CIDR, and the firewall rule the provider makes (spec.forProvider.firewall.manage) admits IPv4 clients only: the proxy's network interface is IPv4 only; add the clients' IPv4 ranges, or set firewall.manage: false and admit them with a rule of your own")
	}
	if err := validLabels(req.Labels); err != nil {
		return nil, err
	}
	files, err := squid.Render(req.Proxy, cloudinit.SquidOptions(req.Mark.UID))
	if err != nil {
		return nil, err
	}
	s.squidConf, s.htpasswd, s.tlsCert, s.tlsKey = files.SquidConf, files.Htpasswd, files.TLSCert, files.TLSKey
	if s.userData, err = d.o.UserData(cloudinit.Options{Squid: files, UserData: req.CloudInit, Hostname: req.Name, EgressReport: egressReport(req)}); err != nil {
		return nil, proxy.Classify(proxy.ClassPermanent, err)
	}
	return s, nil
}

func keys[V any](m map[string]V) string {
	return strings.Join(slices.Sorted(maps.Keys(m)), ", ")
}

// Create implements proxy.Driver. Each step is idempotent and resumable:
// the firewall rule and the static address are ensured first (a Static
// proxy returns after submitting the reservation, whose address the
// instance needs), then the instance is inserted; nothing waits.
//
// A 404 to the insert or to the address or firewall it needs names an
// image, network, subnetwork or zone that does not exist: proxy.Run makes
// it Permanent.
func (d *Driver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	return proxy.Run(ctx, proxy.OpCreate, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.create(ctx, req) })
}

func (d *Driver) create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	s, err := d.resolveSpec(req)
	if err != nil {
		return proxy.Instance{}, err
	}
	d.log(ctx).V(telemetry.VDetail).Info("gcp create", "name", req.Name, "zone", s.zone, "region", s.region, "machineType", s.machineType, "image", s.image,
		"address", s.addressType, "firewall", exposureOf(req).ManageFirewall, "port", req.Proxy.Port, "allowedClientCIDRs", req.Proxy.AllowedClientCIDRs,
		"allowedPorts", req.Proxy.AllowedPorts, "auth", req.Proxy.Auth.Username != "", "cloudInitBytes", len(req.CloudInit), "userDataBytes", len(s.userData))
	inst, err := d.api.GetInstance(ctx, s.zone, req.Name)
	switch {
	case err == nil:
		return d.adopt(ctx, inst, req)
	case !isNotFound(err):
		return proxy.Instance{}, err
	}
	var ops []OpRef
	placeholder := func(progress string) proxy.Instance {
		return proxy.Instance{
			ID: ID(s.zone, req.Name), Name: req.Name, Mark: req.Mark, State: proxy.StateProvisioning,
			Placement: req.Placement, Progress: progress, Operation: joinOps(ops), SpecHash: proxy.Hash(req),
		}
	}
	if exposureOf(req).ManageFirewall {
		op, err := d.ensureFirewall(ctx, req, ProxyTag(req))
		if err != nil {
			return proxy.Instance{}, err
		}
		ops = appendOp(ops, op)
	} else {
		// An earlier attempt, made while the rule was managed, may have
		// left it: the instance made now reads as up to date, so no
		// Update would remove it.
		op, err := d.dropFirewall(ctx, req.Name, req.Mark, false)
		if err != nil {
			return proxy.Instance{}, err
		}
		ops = appendOp(ops, op)
	}
	natIP := ""
	if s.addressType == AddressStatic {
		ip, op, err := d.ensureAddress(ctx, s.region, req)
		if err != nil {
			return proxy.Instance{}, err
		}
		if ip == "" {
			ops = appendOp(ops, op)
			d.o.pending.remember(opsKey(s.zone, req.Name), ops)
			return placeholder("reserving static address " + req.Name + " in " + s.region), nil
		}
		ops, natIP = appendOp(ops, op), ip
	}
	body := buildInstance(d.cfg, s, natIP)
	d.log(ctx).V(telemetry.VDetail).Info("gcp insert request", "id", ID(s.zone, req.Name), "instance", curated(body))
	op, err := d.api.InsertInstance(ctx, s.zone, body)
	switch {
	case isAlreadyExists(err):
		// Created since the read above (a concurrent reconcile): read it,
		// and adopt it only if it is ours.
		inst, err := d.api.GetInstance(ctx, s.zone, req.Name)
		if err != nil {
			return proxy.Instance{}, err
		}
		return d.adopt(ctx, inst, req)
	case err != nil:
		return proxy.Instance{}, err
	}
	ops = append(ops, opRefOf(op))
	d.o.pending.remember(opsKey(s.zone, req.Name), ops)
	d.log(ctx).Info("inserting instance", "id", ID(s.zone, req.Name), "operation", opRefOf(op).String(),
		"machineType", s.machineType, "image", s.image, "address", s.addressType, "firewall", exposureOf(req).ManageFirewall)
	return placeholder("creating instance"), nil
}

// adopt returns an existing instance found by Create if it is ours, and
// refuses (Permanent) one that is not.
func (d *Driver) adopt(ctx context.Context, inst *computeapi.Instance, req proxy.Request) (proxy.Instance, error) {
	if m := markOf(inst.GetLabels()); m != req.Mark {
		return proxy.Instance{}, proxy.Permanentf("instance %q already exists and is not this resource's (%s); refusing to adopt it", req.Name, describeMark(m))
	}
	return d.view(ctx, inst, false, ""), nil
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
func firewallTarget(inst *computeapi.Instance, req proxy.Request) string {
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
		return nil, proxy.Permanentf("spec.forProvider.proxy.allowedClientCIDRs holds no IPv4 CIDR for the firewall rule the provider makes (spec.forProvider.firewall.manage; a rule without source ranges would admit 0.0.0.0/0): add the clients' IPv4 ranges, or set firewall.manage: false and admit them with a rule of your own")
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
