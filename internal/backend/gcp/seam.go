package gcp

import (
	"context"

	"cloud.google.com/go/compute/apiv1/computepb"
)

// API is the seam: exactly the Compute Engine calls the driver makes, ctx
// first, for one project. The production implementation wraps the SDK's
// REST clients (NewSDK); tests point those same clients at an in-process
// fake (gcptest). Every call is one HTTP request.
type API interface {
	GetInstance(ctx context.Context, zone, name string) (*computepb.Instance, error)
	InsertInstance(ctx context.Context, zone string, inst *computepb.Instance) (*computepb.Operation, error)
	// UpdateInstance replaces the instance's updatable fields (labels,
	// metadata, tags) from inst, which carries the fingerprint of the read
	// it was built from; minimalAction RESTART restarts the VM.
	UpdateInstance(ctx context.Context, zone string, inst *computepb.Instance, minimalAction string) (*computepb.Operation, error)
	DeleteInstance(ctx context.Context, zone, name string) (*computepb.Operation, error)
	// AggregatedInstances reads one page of the project-wide listing.
	AggregatedInstances(ctx context.Context, filter string, maxResults uint32, pageToken string) (*computepb.InstanceAggregatedList, error)

	// GetOperation reads a zone, region or global operation.
	GetOperation(ctx context.Context, op OpRef) (*computepb.Operation, error)

	GetAddress(ctx context.Context, region, name string) (*computepb.Address, error)
	InsertAddress(ctx context.Context, region string, a *computepb.Address) (*computepb.Operation, error)
	SetAddressLabels(ctx context.Context, region, name, fingerprint string, labels map[string]string) (*computepb.Operation, error)
	DeleteAddress(ctx context.Context, region, name string) (*computepb.Operation, error)

	// AggregatedAddresses reads one page of the project-wide listing of
	// addresses.
	AggregatedAddresses(ctx context.Context, filter string, maxResults uint32, pageToken string) (*computepb.AddressAggregatedList, error)

	// ListFirewalls reads one page of the project's firewall rules.
	ListFirewalls(ctx context.Context, maxResults uint32, pageToken string) (*computepb.FirewallList, error)
	GetFirewall(ctx context.Context, name string) (*computepb.Firewall, error)
	InsertFirewall(ctx context.Context, fw *computepb.Firewall) (*computepb.Operation, error)
	PatchFirewall(ctx context.Context, name string, fw *computepb.Firewall) (*computepb.Operation, error)
	DeleteFirewall(ctx context.Context, name string) (*computepb.Operation, error)

	// GetGuestAttribute reads one guest attribute (namespace/key) of an
	// instance.
	GetGuestAttribute(ctx context.Context, zone, name, key string) (*computepb.GuestAttributes, error)

	// GetRegion reads a region, for its quotas.
	GetRegion(ctx context.Context, region string) (*computepb.Region, error)

	// Close releases the clients' connections.
	Close() error
}
