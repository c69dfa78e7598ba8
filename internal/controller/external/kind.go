// Package external turns any proxy.Driver into crossplane-runtime's
// external client, for every kind and both scopes: one implementation,
// registered once per scope. It knows Crossplane and nothing of any
// backend's API.
package external

import (
	"context"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Resource is a proxy managed resource of either scope whose parameters are
// of type P. Both scopes' Go types of one kind implement Resource[P] with
// the same P.
type Resource[P any] interface {
	resource.Managed
	Parameters() *P
	Observation() *spec.ProxyObservation
}

// Kind binds one proxy kind to its backend. The generic layer does the
// rest: config resolution, usage tracking, credentials, names, marks,
// conditions, connection details and status.
type Kind[P any] struct {
	// Name of the kind, such as KVMProxy.
	Name string
	// Backend is the ProviderConfig block the kind needs: kvm, proxmox, gcp
	// or kubernetes.
	Backend string
	// LocationField is how the kind spells Placement.Location in its
	// parameters and status: host, node, zone, or "" when it has none.
	LocationField string
	// Proxy returns the common proxy block of the parameters.
	Proxy func(p *P) *spec.ProxySettings
	// Request fills the backend-specific parts of req (placement,
	// cloud-init, exposure) from the parameters, checking them against the
	// config's catalogues. Its errors name the field and the accepted
	// values; they become the Synced condition.
	Request func(cfg *Config, p *P, req *proxy.Request) error
	// Connect builds the driver for one reconcile from the config. It is
	// called on every Connect, so credentials are re-read each time;
	// drivers pool connections keyed by what they were built from.
	Connect func(ctx context.Context, cfg *Config) (proxy.Driver, error)
	// Watches, when set, adds watches to the controller (for example on
	// objects a driver creates in this cluster) so a change reconciles the
	// managed resource at once instead of at the next poll. list is an
	// empty list of the controller's kind, of either scope (a legacy
	// scope's list is not a resource.ManagedList).
	Watches func(mgr manager.Manager, b *builder.Builder, list client.ObjectList) *builder.Builder
}
