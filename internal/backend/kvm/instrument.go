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
	// spanFetch and spanFinish are the background work a create starts:
	// the base image's download into the pool, and the rest of the create
	// once the image is there. Both are children of the create's span.
	spanFetch  = "kvm.image.fetch"
	spanFinish = "kvm.create.finish"

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
		fields := append([]any{"rpc", method}, onHost(ctx, o.host)...)
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

// call runs fn as the libvirt call method, its span and log line
// carrying the identifiers kv (key, value, ...).
func call[T any](o *observed, ctx context.Context, method string, fn func(context.Context) (T, error), kv ...string) (T, error) {
	ctx, end := o.start(ctx, method, kv...)
	v, err := fn(ctx)
	end(err)
	return v, err
}

// do is call for a call that answers only an error.
func (o *observed) do(ctx context.Context, method string, fn func(context.Context) error, kv ...string) error {
	_, err := call(o, ctx, method, func(ctx context.Context) (struct{}, error) { return struct{}{}, fn(ctx) }, kv...)
	return err
}

// onDomain, onPool and onVol are call for a call about one domain, pool
// or volume, which its span names.
func onDomain[T any](o *observed, ctx context.Context, method string, dom libvirt.Domain, fn func(context.Context, libvirt.Domain) (T, error)) (T, error) {
	return call(o, ctx, method, func(ctx context.Context) (T, error) { return fn(ctx, dom) }, attrDomain, dom.Name)
}

func onPool[T any](o *observed, ctx context.Context, method string, pool libvirt.StoragePool, fn func(context.Context, libvirt.StoragePool) (T, error)) (T, error) {
	return call(o, ctx, method, func(ctx context.Context) (T, error) { return fn(ctx, pool) }, attrPool, pool.Name)
}

func onVol[T any](o *observed, ctx context.Context, method string, vol libvirt.StorageVol, fn func(context.Context, libvirt.StorageVol) (T, error)) (T, error) {
	return call(o, ctx, method, func(ctx context.Context) (T, error) { return fn(ctx, vol) }, attrPool, vol.Pool, attrVolume, vol.Name)
}

// errOnly makes a call that answers only an error one that answers a value.
func errOnly[A any](fn func(context.Context, A) error) func(context.Context, A) (struct{}, error) {
	return func(ctx context.Context, a A) (struct{}, error) { return struct{}{}, fn(ctx, a) }
}

func (o *observed) ConnectGetLibVersion(ctx context.Context) (uint64, error) {
	return call(o, ctx, "ConnectGetLibVersion", o.next.ConnectGetLibVersion)
}

func (o *observed) ConnectGetHostname(ctx context.Context) (string, error) {
	return call(o, ctx, "ConnectGetHostname", o.next.ConnectGetHostname)
}

func (o *observed) ConnectListAllDomains(ctx context.Context, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, error) {
	return call(o, ctx, "ConnectListAllDomains", func(ctx context.Context) ([]libvirt.Domain, error) { return o.next.ConnectListAllDomains(ctx, flags) })
}

func (o *observed) DomainGetXMLDesc(ctx context.Context, dom libvirt.Domain) (string, error) {
	return onDomain(o, ctx, "DomainGetXMLDesc", dom, o.next.DomainGetXMLDesc)
}

func (o *observed) DomainLookupByName(ctx context.Context, name string) (libvirt.Domain, error) {
	return call(o, ctx, "DomainLookupByName", func(ctx context.Context) (libvirt.Domain, error) { return o.next.DomainLookupByName(ctx, name) }, attrDomain, name)
}

func (o *observed) DomainDefineXML(ctx context.Context, xml string) (libvirt.Domain, error) {
	return call(o, ctx, "DomainDefineXML", func(ctx context.Context) (libvirt.Domain, error) { return o.next.DomainDefineXML(ctx, xml) }, attrDomain, domainNameOf(xml))
}

func (o *observed) DomainCreate(ctx context.Context, dom libvirt.Domain) error {
	_, err := onDomain(o, ctx, "DomainCreate", dom, errOnly(o.next.DomainCreate))
	return err
}

func (o *observed) DomainDestroy(ctx context.Context, dom libvirt.Domain) error {
	_, err := onDomain(o, ctx, "DomainDestroy", dom, errOnly(o.next.DomainDestroy))
	return err
}

func (o *observed) DomainUndefineFlags(ctx context.Context, dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error {
	return o.do(ctx, "DomainUndefineFlags", func(ctx context.Context) error { return o.next.DomainUndefineFlags(ctx, dom, flags) }, attrDomain, dom.Name)
}

func (o *observed) DomainGetState(ctx context.Context, dom libvirt.Domain) (state libvirt.DomainState, reason int32, err error) {
	err = o.do(ctx, "DomainGetState", func(ctx context.Context) error {
		state, reason, err = o.next.DomainGetState(ctx, dom)
		return err
	}, attrDomain, dom.Name)
	return state, reason, err
}

func (o *observed) DomainGetMetadata(ctx context.Context, dom libvirt.Domain, uri string) (string, error) {
	return call(o, ctx, "DomainGetMetadata", func(ctx context.Context) (string, error) { return o.next.DomainGetMetadata(ctx, dom, uri) }, attrDomain, dom.Name)
}

func (o *observed) DomainSetMetadata(ctx context.Context, dom libvirt.Domain, xml, key, uri string) error {
	return o.do(ctx, "DomainSetMetadata", func(ctx context.Context) error { return o.next.DomainSetMetadata(ctx, dom, xml, key, uri) }, attrDomain, dom.Name)
}

func (o *observed) DomainInterfaceAddresses(ctx context.Context, dom libvirt.Domain, src libvirt.DomainInterfaceAddressesSource) ([]libvirt.DomainInterface, error) {
	return call(o, ctx, "DomainInterfaceAddresses", func(ctx context.Context) ([]libvirt.DomainInterface, error) {
		return o.next.DomainInterfaceAddresses(ctx, dom, src)
	}, attrDomain, dom.Name, "kvm.source", sourceName(src))
}

func (o *observed) QEMUDomainAgentCommand(ctx context.Context, dom libvirt.Domain, cmd string) (string, error) {
	// The command carries file contents (squid.conf, htpasswd): only its
	// name is recorded.
	return call(o, ctx, "QEMUDomainAgentCommand", func(ctx context.Context) (string, error) {
		return o.next.QEMUDomainAgentCommand(ctx, dom, cmd)
	}, attrDomain, dom.Name, "kvm.agent_command", agentCommandName(cmd))
}

func (o *observed) StoragePoolLookupByName(ctx context.Context, name string) (libvirt.StoragePool, error) {
	return call(o, ctx, "StoragePoolLookupByName", func(ctx context.Context) (libvirt.StoragePool, error) {
		return o.next.StoragePoolLookupByName(ctx, name)
	}, attrPool, name)
}

func (o *observed) StoragePoolListAllVolumes(ctx context.Context, pool libvirt.StoragePool) ([]libvirt.StorageVol, error) {
	return onPool(o, ctx, "StoragePoolListAllVolumes", pool, o.next.StoragePoolListAllVolumes)
}

func (o *observed) StoragePoolRefresh(ctx context.Context, pool libvirt.StoragePool) error {
	_, err := onPool(o, ctx, "StoragePoolRefresh", pool, errOnly(o.next.StoragePoolRefresh))
	return err
}

func (o *observed) StoragePoolGetInfo(ctx context.Context, pool libvirt.StoragePool) (PoolInfo, error) {
	return onPool(o, ctx, "StoragePoolGetInfo", pool, o.next.StoragePoolGetInfo)
}

func (o *observed) NodeGetMemoryStats(ctx context.Context) (MemoryStats, error) {
	return call(o, ctx, "NodeGetMemoryStats", o.next.NodeGetMemoryStats)
}

func (o *observed) StorageVolLookupByName(ctx context.Context, pool libvirt.StoragePool, name string) (libvirt.StorageVol, error) {
	return call(o, ctx, "StorageVolLookupByName", func(ctx context.Context) (libvirt.StorageVol, error) {
		return o.next.StorageVolLookupByName(ctx, pool, name)
	}, attrPool, pool.Name, attrVolume, name)
}

func (o *observed) StorageVolGetPath(ctx context.Context, vol libvirt.StorageVol) (string, error) {
	return onVol(o, ctx, "StorageVolGetPath", vol, o.next.StorageVolGetPath)
}

func (o *observed) StorageVolGetXMLDesc(ctx context.Context, vol libvirt.StorageVol) (string, error) {
	return onVol(o, ctx, "StorageVolGetXMLDesc", vol, o.next.StorageVolGetXMLDesc)
}

func (o *observed) StorageVolCreateXML(ctx context.Context, pool libvirt.StoragePool, xml string) (libvirt.StorageVol, error) {
	return call(o, ctx, "StorageVolCreateXML", func(ctx context.Context) (libvirt.StorageVol, error) {
		return o.next.StorageVolCreateXML(ctx, pool, xml)
	}, attrPool, pool.Name, attrVolume, volumeNameOf(xml))
}

func (o *observed) StorageVolUpload(ctx context.Context, vol libvirt.StorageVol, r io.Reader, length uint64) error {
	return o.do(ctx, "StorageVolUpload", func(ctx context.Context) error { return o.next.StorageVolUpload(ctx, vol, r, length) }, attrPool, vol.Pool, attrVolume, vol.Name)
}

func (o *observed) StorageVolDownload(ctx context.Context, vol libvirt.StorageVol, w io.Writer, length uint64) error {
	return o.do(ctx, "StorageVolDownload", func(ctx context.Context) error { return o.next.StorageVolDownload(ctx, vol, w, length) }, attrPool, vol.Pool, attrVolume, vol.Name)
}

func (o *observed) StorageVolDelete(ctx context.Context, vol libvirt.StorageVol) error {
	_, err := onVol(o, ctx, "StorageVolDelete", vol, errOnly(o.next.StorageVolDelete))
	return err
}

// Close is not a libvirt call: no span.
func (o *observed) Close() error { return o.next.Close() }

var sourceNames = map[libvirt.DomainInterfaceAddressesSource]string{
	libvirt.DomainInterfaceAddressesSrcAgent: "agent",
	libvirt.DomainInterfaceAddressesSrcLease: "lease",
	libvirt.DomainInterfaceAddressesSrcArp:   "arp",
}

func sourceName(s libvirt.DomainInterfaceAddressesSource) string { return nameOf(sourceNames, s) }
