package gcp

import (
	"context"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
)

// API is the seam: exactly the Compute Engine calls the driver makes, ctx
// first, for one project. The production implementation speaks Compute
// Engine's REST API (NewSDK); tests point it at an in-process fake
// (gcptest). Every call is one HTTP request.
type API interface {
	GetInstance(ctx context.Context, zone, name string) (*computeapi.Instance, error)
	InsertInstance(ctx context.Context, zone string, inst *computeapi.Instance) (*computeapi.Operation, error)
	// UpdateInstance replaces the instance's updatable fields (labels,
	// metadata, tags) from inst, which carries the fingerprint of the read
	// it was built from; minimalAction RESTART restarts the VM.
	UpdateInstance(ctx context.Context, zone string, inst *computeapi.Instance, minimalAction string) (*computeapi.Operation, error)
	DeleteInstance(ctx context.Context, zone, name string) (*computeapi.Operation, error)
	// AggregatedInstances reads one page of the project-wide listing.
	AggregatedInstances(ctx context.Context, filter string, maxResults uint32, pageToken string) (*computeapi.InstanceAggregatedList, error)

	// GetOperation reads a zone, region or global operation.
	GetOperation(ctx context.Context, op OpRef) (*computeapi.Operation, error)

	GetAddress(ctx context.Context, region, name string) (*computeapi.Address, error)
	InsertAddress(ctx context.Context, region string, a *computeapi.Address) (*computeapi.Operation, error)
	SetAddressLabels(ctx context.Context, region, name, fingerprint string, labels map[string]string) (*computeapi.Operation, error)
	DeleteAddress(ctx context.Context, region, name string) (*computeapi.Operation, error)

	// AggregatedAddresses reads one page of the project-wide listing of
	// addresses.
	AggregatedAddresses(ctx context.Context, filter string, maxResults uint32, pageToken string) (*computeapi.AddressAggregatedList, error)

	// ListFirewalls reads one page of the project's firewall rules.
	ListFirewalls(ctx context.Context, maxResults uint32, pageToken string) (*computeapi.FirewallList, error)
	GetFirewall(ctx context.Context, name string) (*computeapi.Firewall, error)
	InsertFirewall(ctx context.Context, fw *computeapi.Firewall) (*computeapi.Operation, error)
	PatchFirewall(ctx context.Context, name string, fw *computeapi.Firewall) (*computeapi.Operation, error)
	DeleteFirewall(ctx context.Context, name string) (*computeapi.Operation, error)

	// GetGuestAttribute reads one guest attribute (namespace/key) of an
	// instance.
	GetGuestAttribute(ctx context.Context, zone, name, key string) (*computeapi.GuestAttributes, error)

	// GetRegion reads a region, for its quotas.
	GetRegion(ctx context.Context, region string) (*computeapi.Region, error)

	// Close releases the client's idle connections.
	Close() error
}
