package kvm

import (
	"context"
	"io"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Span names and attributes of the driver's own spans (the driver-level
// spans kvm.Create, kvm.Get... come from internal/telemetry).
const (
	spanPrefix   = "kvm.libvirt."
	spanDial     = "kvm.dial"
	spanDownload = "kvm.image.download"

	attrHost   = "kvm.host"
	attrDomain = "kvm.domain"
	attrPool   = "kvm.pool"
	attrVolume = "kvm.volume"
	attrCode   = "kvm.libvirt_code"
)

// observed is the one decorator on the seam: per call a span
// kvm.libvirt.<Method> with the host and the identifiers passed, and inside
// it one V(1) log line "libvirt call", so the line carries the span's
// trace. Never XML bodies at V(1), never upload contents, user-data or
// keys at any level.
type observed struct {
	next   Libvirt
	host   string
	tracer trace.Tracer
	log    func(context.Context) logr.Logger
}

var _ Libvirt = (*observed)(nil)

func (o *observed) start(ctx context.Context, method string, kv ...string) (context.Context, func(error)) {
	attrs := []attribute.KeyValue{attribute.String(attrHost, o.host)}
	for i := 0; i+1 < len(kv); i += 2 {
		attrs = append(attrs, attribute.String(kv[i], kv[i+1]))
	}
	ctx, call := telemetry.StartCall(ctx, o.tracer, "kvm", method, spanPrefix+method, attrs...)
	return ctx, func(err error) {
		fields := []any{"rpc", method, "host", o.host}
		for i := 0; i+1 < len(kv); i += 2 {
			fields = append(fields, kv[i], kv[i+1])
		}
		if c, ok := libvirtCode(err); ok && err != nil {
			call.SetAttributes(attribute.Int(attrCode, int(c)))
			fields = append(fields, "libvirtCode", int(c), "libvirtError", codeName(c))
		}
		call.End(o.log(ctx), "libvirt call", err, fields...)
	}
}

func (o *observed) ConnectGetLibVersion(ctx context.Context) (uint64, error) {
	ctx, end := o.start(ctx, "ConnectGetLibVersion")
	v, err := o.next.ConnectGetLibVersion(ctx)
	end(err)
	return v, err
}

func (o *observed) ConnectGetHostname(ctx context.Context) (string, error) {
	ctx, end := o.start(ctx, "ConnectGetHostname")
	v, err := o.next.ConnectGetHostname(ctx)
	end(err)
	return v, err
}

func (o *observed) ConnectListAllDomains(ctx context.Context, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, error) {
	ctx, end := o.start(ctx, "ConnectListAllDomains")
	v, err := o.next.ConnectListAllDomains(ctx, flags)
	end(err)
	return v, err
}

func (o *observed) DomainGetXMLDesc(ctx context.Context, dom libvirt.Domain) (string, error) {
	ctx, end := o.start(ctx, "DomainGetXMLDesc", attrDomain, dom.Name)
	v, err := o.next.DomainGetXMLDesc(ctx, dom)
	end(err)
	return v, err
}

func (o *observed) DomainLookupByName(ctx context.Context, name string) (libvirt.Domain, error) {
	ctx, end := o.start(ctx, "DomainLookupByName", attrDomain, name)
	v, err := o.next.DomainLookupByName(ctx, name)
	end(err)
	return v, err
}

func (o *observed) DomainDefineXML(ctx context.Context, xml string) (libvirt.Domain, error) {
	ctx, end := o.start(ctx, "DomainDefineXML", attrDomain, domainNameOf(xml))
	v, err := o.next.DomainDefineXML(ctx, xml)
	end(err)
	return v, err
}

func (o *observed) DomainCreate(ctx context.Context, dom libvirt.Domain) error {
	ctx, end := o.start(ctx, "DomainCreate", attrDomain, dom.Name)
	err := o.next.DomainCreate(ctx, dom)
	end(err)
	return err
}

func (o *observed) DomainDestroy(ctx context.Context, dom libvirt.Domain) error {
	ctx, end := o.start(ctx, "DomainDestroy", attrDomain, dom.Name)
	err := o.next.DomainDestroy(ctx, dom)
	end(err)
	return err
}

func (o *observed) DomainUndefineFlags(ctx context.Context, dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error {
	ctx, end := o.start(ctx, "DomainUndefineFlags", attrDomain, dom.Name)
	err := o.next.DomainUndefineFlags(ctx, dom, flags)
	end(err)
	return err
}

func (o *observed) DomainGetState(ctx context.Context, dom libvirt.Domain) (libvirt.DomainState, int32, error) {
	ctx, end := o.start(ctx, "DomainGetState", attrDomain, dom.Name)
	v, r, err := o.next.DomainGetState(ctx, dom)
	end(err)
	return v, r, err
}

func (o *observed) DomainGetMetadata(ctx context.Context, dom libvirt.Domain, uri string) (string, error) {
	ctx, end := o.start(ctx, "DomainGetMetadata", attrDomain, dom.Name)
	v, err := o.next.DomainGetMetadata(ctx, dom, uri)
	end(err)
	return v, err
}

func (o *observed) DomainSetMetadata(ctx context.Context, dom libvirt.Domain, xml, key, uri string) error {
	ctx, end := o.start(ctx, "DomainSetMetadata", attrDomain, dom.Name)
	err := o.next.DomainSetMetadata(ctx, dom, xml, key, uri)
	end(err)
	return err
}

func (o *observed) DomainInterfaceAddresses(ctx context.Context, dom libvirt.Domain, src libvirt.DomainInterfaceAddressesSource) ([]libvirt.DomainInterface, error) {
	ctx, end := o.start(ctx, "DomainInterfaceAddresses", attrDomain, dom.Name, "kvm.source", sourceName(src))
	v, err := o.next.DomainInterfaceAddresses(ctx, dom, src)
	end(err)
	return v, err
}

func (o *observed) QEMUDomainAgentCommand(ctx context.Context, dom libvirt.Domain, cmd string) (string, error) {
	// The command carries file contents (squid.conf, htpasswd): only its
	// name is recorded.
	ctx, end := o.start(ctx, "QEMUDomainAgentCommand", attrDomain, dom.Name, "kvm.agent_command", agentCommandName(cmd))
	v, err := o.next.QEMUDomainAgentCommand(ctx, dom, cmd)
	end(err)
	return v, err
}

func (o *observed) StoragePoolLookupByName(ctx context.Context, name string) (libvirt.StoragePool, error) {
	ctx, end := o.start(ctx, "StoragePoolLookupByName", attrPool, name)
	v, err := o.next.StoragePoolLookupByName(ctx, name)
	end(err)
	return v, err
}

func (o *observed) StoragePoolRefresh(ctx context.Context, pool libvirt.StoragePool) error {
	ctx, end := o.start(ctx, "StoragePoolRefresh", attrPool, pool.Name)
	err := o.next.StoragePoolRefresh(ctx, pool)
	end(err)
	return err
}

func (o *observed) StoragePoolGetInfo(ctx context.Context, pool libvirt.StoragePool) (PoolInfo, error) {
	ctx, end := o.start(ctx, "StoragePoolGetInfo", attrPool, pool.Name)
	v, err := o.next.StoragePoolGetInfo(ctx, pool)
	end(err)
	return v, err
}

func (o *observed) NodeGetMemoryStats(ctx context.Context) (MemoryStats, error) {
	ctx, end := o.start(ctx, "NodeGetMemoryStats")
	v, err := o.next.NodeGetMemoryStats(ctx)
	end(err)
	return v, err
}

func (o *observed) StorageVolLookupByName(ctx context.Context, pool libvirt.StoragePool, name string) (libvirt.StorageVol, error) {
	ctx, end := o.start(ctx, "StorageVolLookupByName", attrPool, pool.Name, attrVolume, name)
	v, err := o.next.StorageVolLookupByName(ctx, pool, name)
	end(err)
	return v, err
}

func (o *observed) StorageVolGetPath(ctx context.Context, vol libvirt.StorageVol) (string, error) {
	ctx, end := o.start(ctx, "StorageVolGetPath", attrPool, vol.Pool, attrVolume, vol.Name)
	v, err := o.next.StorageVolGetPath(ctx, vol)
	end(err)
	return v, err
}

func (o *observed) StorageVolGetXMLDesc(ctx context.Context, vol libvirt.StorageVol) (string, error) {
	ctx, end := o.start(ctx, "StorageVolGetXMLDesc", attrPool, vol.Pool, attrVolume, vol.Name)
	v, err := o.next.StorageVolGetXMLDesc(ctx, vol)
	end(err)
	return v, err
}

func (o *observed) StorageVolCreateXML(ctx context.Context, pool libvirt.StoragePool, xml string) (libvirt.StorageVol, error) {
	ctx, end := o.start(ctx, "StorageVolCreateXML", attrPool, pool.Name, attrVolume, volumeNameOf(xml))
	v, err := o.next.StorageVolCreateXML(ctx, pool, xml)
	end(err)
	return v, err
}

func (o *observed) StorageVolUpload(ctx context.Context, vol libvirt.StorageVol, r io.Reader, length uint64) error {
	ctx, end := o.start(ctx, "StorageVolUpload", attrPool, vol.Pool, attrVolume, vol.Name)
	err := o.next.StorageVolUpload(ctx, vol, r, length)
	end(err)
	return err
}

func (o *observed) StorageVolDownload(ctx context.Context, vol libvirt.StorageVol, w io.Writer, length uint64) error {
	ctx, end := o.start(ctx, "StorageVolDownload", attrPool, vol.Pool, attrVolume, vol.Name)
	err := o.next.StorageVolDownload(ctx, vol, w, length)
	end(err)
	return err
}

func (o *observed) StorageVolDelete(ctx context.Context, vol libvirt.StorageVol) error {
	ctx, end := o.start(ctx, "StorageVolDelete", attrPool, vol.Pool, attrVolume, vol.Name)
	err := o.next.StorageVolDelete(ctx, vol)
	end(err)
	return err
}

// Close is not a libvirt call: no span.
func (o *observed) Close() error { return o.next.Close() }

func sourceName(s libvirt.DomainInterfaceAddressesSource) string {
	switch s {
	case libvirt.DomainInterfaceAddressesSrcAgent:
		return "agent"
	case libvirt.DomainInterfaceAddressesSrcLease:
		return "lease"
	case libvirt.DomainInterfaceAddressesSrcArp:
		return "arp"
	}
	return "unknown"
}
