package kvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/digitalocean/go-libvirt"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// formatID is hosts/<host>/domains/<name>.
func formatID(host, name string) string { return "hosts/" + host + "/domains/" + name }

// parseID is strict: exactly four segments, literal hosts and domains,
// a valid host and name.
func parseID(id string) (host, name string, err error) {
	parts := strings.Split(id, "/")
	if len(parts) != 4 || parts[0] != "hosts" || parts[2] != "domains" || !validName.MatchString(parts[1]) || !validName.MatchString(parts[3]) {
		return "", "", proxy.Permanentf("%q is not a kvm instance ID (hosts/<host>/domains/<name>)", id)
	}
	return parts[1], parts[3], nil
}

// resolve finds the host and name a Ref means: its ID when set, else its
// name on the placement's host.
func (d *Driver) resolve(ref proxy.Ref) (Host, string, error) {
	if ref.ID != "" {
		hn, name, err := parseID(ref.ID)
		if err != nil {
			return Host{}, "", err
		}
		h, err := d.host(hn)
		if err != nil {
			return Host{}, "", errHostGone{hn}
		}
		return h, name, nil
	}
	if !validName.MatchString(ref.Name) {
		return Host{}, "", proxy.Permanentf("instance name %q is not a valid domain name", ref.Name)
	}
	h, err := d.host(ref.Placement.Location)
	return h, ref.Name, err
}

// errHostGone is an ID naming a host the config no longer has.
type errHostGone struct{ host string }

func (e errHostGone) Error() string {
	return fmt.Sprintf("host %q is no longer in the config's kvm.hosts", e.host)
}

// Get implements proxy.Driver: the domain's state, address and mark, and
// whether Squid answers. A Create waiting for its image reads as
// Provisioning with the download's progress.
func (d *Driver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	return proxy.Run(ctx, proxy.OpGet, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.get(ctx, ref) })
}

func (d *Driver) get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	h, name, err := d.resolve(ref)
	if gone := (errHostGone{}); errors.As(err, &gone) {
		return proxy.Instance{}, proxy.Permanentf("%v: the provider cannot reach its instances", gone)
	}
	if err != nil {
		return proxy.Instance{}, err
	}
	api, dom, meta, err := d.lookupMeta(ctx, h, name)
	if isCode(err, libvirt.ErrNoDomain) {
		if pe := d.b.pendingFor(Target{Host: h}.endpoint() + "/" + name); pe != nil {
			if ferr := pe.failure(); ferr != nil {
				d.b.removePending(pe) // reported once; the next Create starts over
				return proxy.Instance{}, ferr
			}
			return pe.view(), nil
		}
		if ref.Deleting {
			return d.leftovers(ctx, api, h, name, ref.Mark)
		}
		return proxy.Instance{}, proxy.NotFoundf("domain %s does not exist on host %s", name, h.Name)
	}
	if err != nil {
		return proxy.Instance{}, err
	}
	if !ref.Deleting {
		// A resource being deleted needs no start: a start that fails
		// would hold its deletion.
		if err := d.resumeStart(ctx, api, h, dom, meta, ref.Mark); err != nil {
			return proxy.Instance{}, err
		}
	}
	return d.read(ctx, api, h, dom, meta, ref.ProxyCA, ref.TenantGuest)
}

// resumeStart starts a domain of this resource that was defined but never
// started: the provider stopped between define and start. Observe finds
// it (so Create is not called again) and must not leave it waiting
// forever. Only for the resource's own mark, never for a resource being
// deleted, and never while a Create or Delete of the name is running.
func (d *Driver) resumeStart(ctx context.Context, api Libvirt, h Host, dom libvirt.Domain, meta instanceMeta, mark proxy.Mark) error {
	if mark.UID == "" || meta.mark() != mark {
		return nil
	}
	state, reason, err := api.DomainGetState(ctx, dom)
	if err != nil || state != libvirt.DomainShutoff || reason != int32(libvirt.DomainShutoffUnknown) {
		return err
	}
	unlock, ok := d.b.names.tryLock(Target{Host: h}.endpoint() + "/" + dom.Name)
	if !ok {
		return nil
	}
	defer unlock()
	d.log(ctx).Info("kvm: starting a domain whose create was interrupted between define and start", "host", h.Name, "name", dom.Name)
	return startDomain(ctx, api, dom)
}

// readMeta reads the ownership element; a domain without one is unmarked.
// lookupMeta connects to h, looks the domain name up there and reads the
// provider's metadata on it; a missing domain is libvirt's ErrNoDomain.
func (d *Driver) lookupMeta(ctx context.Context, h Host, name string) (Libvirt, libvirt.Domain, instanceMeta, error) {
	api, err := d.conn(ctx, h)
	if err != nil {
		return nil, libvirt.Domain{}, instanceMeta{}, err
	}
	dom, err := api.DomainLookupByName(ctx, name)
	if err != nil {
		return api, dom, instanceMeta{}, err
	}
	meta, err := readMeta(ctx, api, dom)
	return api, dom, meta, err
}

func readMeta(ctx context.Context, api Libvirt, dom libvirt.Domain) (instanceMeta, error) {
	x, err := api.DomainGetMetadata(ctx, dom, metadataURI)
	if isCode(err, libvirt.ErrNoDomainMetadata) {
		return instanceMeta{}, nil
	}
	if err != nil {
		return instanceMeta{}, err
	}
	return parseMeta(x)
}

// read builds the Instance of an existing domain; ca is the proxy's CA
// when it listens with TLS (the probe verifies against it); tenantGuest
// is Ref.TenantGuest (reportedGuard).
func (d *Driver) read(ctx context.Context, api Libvirt, h Host, dom libvirt.Domain, meta instanceMeta, ca string, tenantGuest bool) (proxy.Instance, error) {
	state, reason, err := api.DomainGetState(ctx, dom)
	if err != nil {
		return proxy.Instance{}, err
	}
	inst := proxy.Instance{
		ID:        formatID(h.Name, dom.Name),
		Name:      dom.Name,
		Mark:      meta.mark(),
		CreatedAt: meta.createdAt(),
		SpecHash:  meta.SpecHash,
		Placement: proxy.Placement{Location: h.Name, MachineType: meta.MachineType, Image: meta.Image},
	}
	active := state == libvirt.DomainRunning || state == libvirt.DomainBlocked
	if active {
		ip, found, err := address(ctx, api, dom)
		d.logAbout(ctx, h.Name, dom.Name).V(telemetry.VDetail).Info("kvm addresses found", "addresses", found, "ip", ip)
		if err != nil {
			return proxy.Instance{}, err
		}
		inst.IP = ip
		if h.Routed {
			inst.EgressIP, inst.EgressSource, inst.BackendEgressIP = ip, proxy.EgressBackend, ip
		}
	}
	inst.State = mapState(state, reason, inst.IP)
	port := meta.Port
	if port == 0 {
		port = 3128
	}
	switch {
	case inst.State == proxy.StateRunning:
		addr := net.JoinHostPort(inst.IP, strconv.Itoa(int(port)))
		// The prober is every config's: an ID names the host as the
		// config does.
		pr := d.b.prober.Check(ctx, d.reportedGuard(meta, tenantGuest).Reported(), d.cfg.Name+"/"+inst.ID, addr, squid.Expected(inst.Mark), ca)
		inst.ProxyReachable = pr.Serving
		if pr.Serving {
			inst.ProxyAddress = addr
			squid.NoteAnswer(&inst, pr)
		}
		switch {
		case pr.Refused:
			inst.Progress = pr.Message
		case pr.Pending:
			inst.Progress = "booting: waiting for Squid to answer on " + addr
		case !pr.Serving:
			inst.Progress = "booting: waiting for Squid to answer: " + pr.Message
			// Unreached: the guest's own check stands for the probe.
			d.readReport(ctx, api, dom, &inst)
		}
	case inst.State == proxy.StateProvisioning && active:
		inst.Progress = "booting: waiting for an address from the guest agent or the DHCP lease"
	case inst.State == proxy.StateProvisioning:
		inst.Progress = "defined; starting"
	}
	d.logAbout(ctx, h.Name, dom.Name).V(1).Info("kvm domain fetched", "state", inst.State, "ip", inst.IP, "uid", inst.Mark.UID)
	d.logAbout(ctx, h.Name, dom.Name).V(telemetry.VDetail).Info("kvm domain metadata", "metadata", meta.element(true), "libvirtState", int(state), "libvirtReason", reason)
	return inst, nil
}

// reportedGuard is the guard of the addresses a domain's guest reports:
// the config's, or URLGuard's (the tenant guard) for a domain booted from
// an image a proxy names by URL or whose guest a tenant writes otherwise
// (Ref.TenantGuest: its cloud-init), since its guest agent and DHCP
// client are then the tenant's to write.
func (d *Driver) reportedGuard(meta instanceMeta, tenantGuest bool) *netguard.Guard {
	if (meta.Image == "url" || tenantGuest) && d.cfg.URLGuard != nil {
		return d.cfg.URLGuard
	}
	return d.cfg.Guard
}

// mapState maps libvirt's state. A shut-off domain that never ran (reason
// unknown: defined, not yet started, as after a crash between define and
// start) is Provisioning, never Stopped.
func mapState(s libvirt.DomainState, reason int32, ip string) proxy.State {
	switch s {
	case libvirt.DomainNostate:
		return proxy.StateProvisioning
	case libvirt.DomainRunning, libvirt.DomainBlocked:
		if ip == "" {
			return proxy.StateProvisioning
		}
		return proxy.StateRunning
	case libvirt.DomainShutoff:
		if reason == int32(libvirt.DomainShutoffUnknown) {
			return proxy.StateProvisioning
		}
		return proxy.StateStopped
	}
	return proxy.StateStopped
}

// addressSources are asked in order: the guest agent knows the address
// first and on any network; the lease works on libvirt networks; ARP needs
// the host to have talked to the guest.
var addressSources = []libvirt.DomainInterfaceAddressesSource{
	libvirt.DomainInterfaceAddressesSrcAgent,
	libvirt.DomainInterfaceAddressesSrcLease,
	libvirt.DomainInterfaceAddressesSrcArp,
}

// address is the first routable IPv4 any source knows. A source failing
// (the agent not up yet) means "ask the next"; every source failing is
// Transient, since a running domain whose address cannot be read is not a
// domain without an address.
// found is what each source asked answered, for the log.
func address(ctx context.Context, api Libvirt, dom libvirt.Domain) (ip string, found []string, err error) {
	var errs []string
	for _, src := range addressSources {
		ifs, err := api.DomainInterfaceAddresses(ctx, dom, src)
		if err != nil {
			if ctx.Err() != nil {
				return "", found, ctx.Err()
			}
			errs = append(errs, sourceName(src)+": "+err.Error())
			found = append(found, sourceName(src)+": "+err.Error())
			continue
		}
		var addrs []string
		for _, i := range ifs {
			for _, a := range i.Addrs {
				addrs = append(addrs, i.Name+"="+a.Addr)
			}
		}
		found = append(found, sourceName(src)+": "+strings.Join(addrs, " "))
		if ip := firstIPv4(ifs); ip != "" {
			return ip, found, nil
		}
	}
	if len(errs) == len(addressSources) {
		return "", found, proxy.Transientf("no address source answered for domain %s: %s", dom.Name, strings.Join(errs, "; "))
	}
	return "", found, nil
}

func firstIPv4(ifs []libvirt.DomainInterface) string {
	for _, i := range ifs {
		if i.Name == "lo" {
			continue
		}
		for _, a := range i.Addrs {
			ip, err := netip.ParseAddr(a.Addr)
			if err != nil || !ip.Is4() || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() {
				continue
			}
			if a.Type != int32(libvirt.IPAddrTypeIpv4) {
				continue
			}
			return ip.String()
		}
	}
	return ""
}
