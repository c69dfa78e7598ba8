package kvm

import (
	"context"
	"io"

	"github.com/digitalocean/go-libvirt"
)

// Libvirt is the seam between the driver and libvirt: exactly the go-libvirt
// calls the driver makes, each with ctx first (go-libvirt's own methods take
// none and block). The production adapter (adapter) applies a budget per
// call; the decorator (observed) adds a span and a log line per call; tests
// put an in-memory fake behind it.
type Libvirt interface {
	ConnectGetLibVersion(ctx context.Context) (uint64, error)
	ConnectGetHostname(ctx context.Context) (string, error)
	ConnectListAllDomains(ctx context.Context, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, error)

	DomainLookupByName(ctx context.Context, name string) (libvirt.Domain, error)
	DomainDefineXML(ctx context.Context, xml string) (libvirt.Domain, error)
	DomainCreate(ctx context.Context, dom libvirt.Domain) error
	DomainDestroy(ctx context.Context, dom libvirt.Domain) error
	DomainUndefineFlags(ctx context.Context, dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error
	// DomainGetState returns the state and its reason (for shutoff, 0 is
	// "never started").
	DomainGetState(ctx context.Context, dom libvirt.Domain) (libvirt.DomainState, int32, error)
	DomainGetMetadata(ctx context.Context, dom libvirt.Domain, uri string) (string, error)
	// DomainGetXMLDesc returns the domain's definition (for the disks it
	// uses).
	DomainGetXMLDesc(ctx context.Context, dom libvirt.Domain) (string, error)
	DomainSetMetadata(ctx context.Context, dom libvirt.Domain, xml, key, uri string) error
	DomainInterfaceAddresses(ctx context.Context, dom libvirt.Domain, src libvirt.DomainInterfaceAddressesSource) ([]libvirt.DomainInterface, error)
	QEMUDomainAgentCommand(ctx context.Context, dom libvirt.Domain, cmd string) (string, error)

	StoragePoolLookupByName(ctx context.Context, name string) (libvirt.StoragePool, error)
	StoragePoolRefresh(ctx context.Context, pool libvirt.StoragePool) error
	StoragePoolGetInfo(ctx context.Context, pool libvirt.StoragePool) (PoolInfo, error)
	NodeGetMemoryStats(ctx context.Context) (MemoryStats, error)

	// StoragePoolListAllVolumes lists the pool's volumes.
	StoragePoolListAllVolumes(ctx context.Context, pool libvirt.StoragePool) ([]libvirt.StorageVol, error)
	StorageVolLookupByName(ctx context.Context, pool libvirt.StoragePool, name string) (libvirt.StorageVol, error)
	StorageVolGetPath(ctx context.Context, vol libvirt.StorageVol) (string, error)
	StorageVolGetXMLDesc(ctx context.Context, vol libvirt.StorageVol) (string, error)
	StorageVolCreateXML(ctx context.Context, pool libvirt.StoragePool, xml string) (libvirt.StorageVol, error)
	// StorageVolUpload writes length bytes read from r into vol from
	// offset 0.
	StorageVolUpload(ctx context.Context, vol libvirt.StorageVol, r io.Reader, length uint64) error
	// StorageVolDownload writes the first length bytes of vol to w.
	StorageVolDownload(ctx context.Context, vol libvirt.StorageVol, w io.Writer, length uint64) error
	StorageVolDelete(ctx context.Context, vol libvirt.StorageVol) error

	// Close ends the connection; calls in flight fail.
	Close() error
}

// MemoryStats is the host's memory (NodeGetMemoryStats over all cells), in
// bytes.
type MemoryStats struct {
	Total, Free, Buffers, Cached uint64
}

// Available is what a new guest can have without pushing the host into
// swap: free memory plus the page cache and buffers the kernel gives back.
func (m MemoryStats) Available() uint64 { return m.Free + m.Buffers + m.Cached }

// PoolInfo is StoragePoolGetInfo's answer.
type PoolInfo struct {
	State      libvirt.StoragePoolState
	Capacity   uint64
	Allocation uint64
	Available  uint64
}
