package kvm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// adapter is the production Libvirt: go-libvirt over one link, each call
// within its budget.
type adapter struct {
	l       *libvirt.Libvirt
	link    *link
	budgets Budgets
	// quiet: the host is a tenant's; libvirtd's messages are not quoted.
	quiet bool
}

var _ Libvirt = (*adapter)(nil)

func rpc[T any](ctx context.Context, a *adapter, fn func() (T, error)) (T, error) {
	v, err := callValue(ctx, a.link, budgetOf(ctx, a.budgets.RPC), fn)
	return v, a.quietly(err)
}

func rpcErr(ctx context.Context, a *adapter, budget time.Duration, fn func() error) error {
	return a.quietly(a.link.call(ctx, budgetOf(ctx, budget), fn))
}

// quietly is err with libvirtd's message left out for a tenant's host: its
// code (what the driver decides by) stays, and so does its name.
func (a *adapter) quietly(err error) error {
	var le libvirt.Error
	if !a.quiet || !errors.As(err, &le) {
		return err
	}
	return &quietLibvirtError{err: err, code: libvirt.ErrorNumber(le.Code)}
}

type quietLibvirtError struct {
	err  error
	code libvirt.ErrorNumber
}

func (e *quietLibvirtError) Error() string {
	return "libvirt refused the call: " + codeName(e.code) + " (libvirtd's message is not shown to tenants)"
}

func (e *quietLibvirtError) Unwrap() error { return e.err }

func (a *adapter) ConnectGetLibVersion(ctx context.Context) (uint64, error) {
	return rpc(ctx, a, a.l.ConnectGetLibVersion)
}

func (a *adapter) ConnectGetHostname(ctx context.Context) (string, error) {
	return rpc(ctx, a, a.l.ConnectGetHostname)
}

func (a *adapter) ConnectListAllDomains(ctx context.Context, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, error) {
	return rpc(ctx, a, func() ([]libvirt.Domain, error) {
		d, _, err := a.l.ConnectListAllDomains(1, flags)
		return d, err
	})
}

func (a *adapter) DomainGetXMLDesc(ctx context.Context, dom libvirt.Domain) (string, error) {
	return rpc(ctx, a, func() (string, error) { return a.l.DomainGetXMLDesc(dom, libvirt.DomainXMLInactive) })
}

func (a *adapter) DomainLookupByName(ctx context.Context, name string) (libvirt.Domain, error) {
	return rpc(ctx, a, func() (libvirt.Domain, error) { return a.l.DomainLookupByName(name) })
}

func (a *adapter) DomainDefineXML(ctx context.Context, xml string) (libvirt.Domain, error) {
	return rpc(ctx, a, func() (libvirt.Domain, error) { return a.l.DomainDefineXML(xml) })
}

func (a *adapter) DomainCreate(ctx context.Context, dom libvirt.Domain) error {
	return rpcErr(ctx, a, a.budgets.DomainCreate, func() error { return a.l.DomainCreate(dom) })
}

func (a *adapter) DomainDestroy(ctx context.Context, dom libvirt.Domain) error {
	return rpcErr(ctx, a, a.budgets.RPC, func() error { return a.l.DomainDestroy(dom) })
}

func (a *adapter) DomainUndefineFlags(ctx context.Context, dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error {
	return rpcErr(ctx, a, a.budgets.RPC, func() error { return a.l.DomainUndefineFlags(dom, flags) })
}

type domainState struct {
	s      libvirt.DomainState
	reason int32
}

func (a *adapter) DomainGetState(ctx context.Context, dom libvirt.Domain) (libvirt.DomainState, int32, error) {
	st, err := rpc(ctx, a, func() (domainState, error) {
		s, r, err := a.l.DomainGetState(dom, 0)
		return domainState{libvirt.DomainState(s), r}, err
	})
	return st.s, st.reason, err
}

func (a *adapter) DomainGetMetadata(ctx context.Context, dom libvirt.Domain, uri string) (string, error) {
	return rpc(ctx, a, func() (string, error) {
		return a.l.DomainGetMetadata(dom, int32(libvirt.DomainMetadataElement), libvirt.OptString{uri}, libvirt.DomainAffectCurrent)
	})
}

func (a *adapter) DomainSetMetadata(ctx context.Context, dom libvirt.Domain, xml, key, uri string) error {
	return rpcErr(ctx, a, a.budgets.RPC, func() error {
		// Config and live: the mark must survive a restart of the domain.
		return a.l.DomainSetMetadata(dom, int32(libvirt.DomainMetadataElement), libvirt.OptString{xml}, libvirt.OptString{key}, libvirt.OptString{uri},
			libvirt.DomainAffectConfig|libvirt.DomainAffectLive)
	})
}

func (a *adapter) DomainInterfaceAddresses(ctx context.Context, dom libvirt.Domain, src libvirt.DomainInterfaceAddressesSource) ([]libvirt.DomainInterface, error) {
	return rpc(ctx, a, func() ([]libvirt.DomainInterface, error) { return a.l.DomainInterfaceAddresses(dom, uint32(src), 0) })
}

func (a *adapter) QEMUDomainAgentCommand(ctx context.Context, dom libvirt.Domain, cmd string) (string, error) {
	return rpc(ctx, a, func() (string, error) {
		r, err := a.l.QEMUDomainAgentCommand(dom, cmd, int32(libvirt.DomainAgentResponseTimeoutDefault), 0)
		if len(r) > 0 {
			return r[0], err
		}
		return "", err
	})
}

func (a *adapter) StoragePoolLookupByName(ctx context.Context, name string) (libvirt.StoragePool, error) {
	return rpc(ctx, a, func() (libvirt.StoragePool, error) { return a.l.StoragePoolLookupByName(name) })
}

func (a *adapter) StoragePoolListAllVolumes(ctx context.Context, pool libvirt.StoragePool) ([]libvirt.StorageVol, error) {
	return rpc(ctx, a, func() ([]libvirt.StorageVol, error) {
		vols, _, err := a.l.StoragePoolListAllVolumes(pool, 1, 0)
		return vols, err
	})
}

func (a *adapter) StoragePoolRefresh(ctx context.Context, pool libvirt.StoragePool) error {
	return rpcErr(ctx, a, a.budgets.RPC, func() error { return a.l.StoragePoolRefresh(pool, 0) })
}

func (a *adapter) StoragePoolGetInfo(ctx context.Context, pool libvirt.StoragePool) (PoolInfo, error) {
	return rpc(ctx, a, func() (PoolInfo, error) {
		st, c, al, av, err := a.l.StoragePoolGetInfo(pool)
		return PoolInfo{State: libvirt.StoragePoolState(st), Capacity: c, Allocation: al, Available: av}, err
	})
}

// NodeGetMemoryStats asks for the number of fields, then for the fields,
// of all NUMA cells together (libvirt reports KiB).
func (a *adapter) NodeGetMemoryStats(ctx context.Context) (MemoryStats, error) {
	return rpc(ctx, a, func() (MemoryStats, error) {
		const allCells = -1 // VIR_NODE_MEMORY_STATS_ALL_CELLS
		_, n, err := a.l.NodeGetMemoryStats(0, allCells, 0)
		if err != nil {
			return MemoryStats{}, err
		}
		params, _, err := a.l.NodeGetMemoryStats(n, allCells, 0)
		if err != nil {
			return MemoryStats{}, err
		}
		var m MemoryStats
		for _, p := range params {
			switch p.Field {
			case "total":
				m.Total = p.Value << 10
			case "free":
				m.Free = p.Value << 10
			case "buffers":
				m.Buffers = p.Value << 10
			case "cached":
				m.Cached = p.Value << 10
			}
		}
		return m, nil
	})
}

func (a *adapter) StorageVolLookupByName(ctx context.Context, pool libvirt.StoragePool, name string) (libvirt.StorageVol, error) {
	return rpc(ctx, a, func() (libvirt.StorageVol, error) { return a.l.StorageVolLookupByName(pool, name) })
}

func (a *adapter) StorageVolGetPath(ctx context.Context, vol libvirt.StorageVol) (string, error) {
	return rpc(ctx, a, func() (string, error) { return a.l.StorageVolGetPath(vol) })
}

func (a *adapter) StorageVolGetXMLDesc(ctx context.Context, vol libvirt.StorageVol) (string, error) {
	return rpc(ctx, a, func() (string, error) { return a.l.StorageVolGetXMLDesc(vol, 0) })
}

func (a *adapter) StorageVolCreateXML(ctx context.Context, pool libvirt.StoragePool, xml string) (libvirt.StorageVol, error) {
	return rpc(ctx, a, func() (libvirt.StorageVol, error) { return a.l.StorageVolCreateXML(pool, xml, 0) })
}

// StorageVolUpload streams r. An abandoned upload may still read from r
// until the link closes; callers hand it a reader nobody else reads.
func (a *adapter) StorageVolUpload(ctx context.Context, vol libvirt.StorageVol, r io.Reader, length uint64) error {
	return rpcErr(ctx, a, a.budgets.SeedUpload, func() error { return a.l.StorageVolUpload(vol, r, 0, length, 0) })
}

// StorageVolDownload downloads into a buffer of its own (the driver reads
// markers of 64 bytes), so an abandoned download never writes to w.
func (a *adapter) StorageVolDownload(ctx context.Context, vol libvirt.StorageVol, w io.Writer, length uint64) error {
	b, err := rpc(ctx, a, func() ([]byte, error) {
		var buf bytes.Buffer
		err := a.l.StorageVolDownload(vol, &buf, 0, length, 0)
		return buf.Bytes(), err
	})
	if err != nil {
		return err
	}
	if uint64(len(b)) != length {
		// Never read a short answer as the volume's content.
		return proxy.Transientf("libvirt sent %d of the %d bytes of volume %s asked for", len(b), length, vol.Name)
	}
	_, err = w.Write(b)
	return err
}

func (a *adapter) StorageVolDelete(ctx context.Context, vol libvirt.StorageVol) error {
	return rpcErr(ctx, a, a.budgets.RPC, func() error { return a.l.StorageVolDelete(vol, 0) })
}

// Close closes the link now.
func (a *adapter) Close() error {
	a.link.close("closed by its owner")
	return nil
}
