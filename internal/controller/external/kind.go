// Package external turns any proxy.Driver into crossplane-runtime's
// external client, for every kind and both scopes: one implementation,
// registered once per scope. It knows Crossplane and nothing of any
// backend: what differs per backend is data on the kind's description
// (Kind, Backend), given by the kind's binding.
package external

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
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
// conditions, connection details and status. Every binding (package kvm,
// proxmox, gcp, pod) returns one from its New, and keeps its state in it.
type Kind[P any] struct {
	// Name of the kind, such as KVMProxy.
	Name string
	// GVKs are the kind's namespaced and cluster-scoped versions, which
	// share parameters P.
	GVKs []schema.GroupVersionKind
	// Backend is the backend the kind runs on.
	Backend Backend
	// Location returns the field of status.atProvider.placement that holds
	// Placement.Location (Host, Node, Zone); nil when the kind has none.
	Location func(p *spec.Placement) *string
	// Proxy returns the common proxy block of the parameters.
	Proxy func(p *P) *spec.ProxySettings
	// Request fills the backend-specific parts of req (placement,
	// cloud-init, the backend's Extension) from the parameters, checking
	// them against the config's catalogues. Its errors name the field and
	// the accepted values; they become the Synced condition.
	Request func(cfg *Config, p *P, req *proxy.Request) error
	// Owned, when set, adds to req what ties the instance to the managed
	// resource itself, where the backend lives with it (a PodProxy's
	// Deployment in the provider's own cluster, owned by the PodProxy so
	// that the garbage collector removes it once the resource is gone
	// for good). It is called after Request, for Create and Update.
	Owned func(cfg *Config, mg resource.Managed, req *proxy.Request)
	// Release, when set, undoes what Owned tied to a resource being
	// deleted whose deletion leaves its instance (deletionPolicy Orphan,
	// management policies without Delete), before its finalizer goes: the
	// garbage collector would otherwise delete the instance the user asked
	// to keep once the resource is gone. childrenFinalizer calls it for
	// every resource of the kind being deleted (it returns nil at once for
	// one whose deletion deletes its instance), with the managed
	// reconcilers' client; an error keeps the finalizer, and the reconcile
	// is retried.
	Release func(ctx context.Context, kube client.Client, mg resource.Managed) error
	// PublicListener, when set, says where the parameters put the proxy's
	// listener on the internet ("an external address", "a LoadBalancer
	// Service"), "" when they do not: auth without TLS there is a
	// Secure=False warning. Any kind's listener on a public IP address
	// counts too.
	PublicListener func(p *P) string
	// Watches, when set, adds watches to the controller (for example on
	// objects a driver creates in this cluster) so a change reconciles the
	// managed resource at once instead of at the next poll. list is an
	// empty list of the controller's kind, of either scope.
	Watches func(mgr manager.Manager, b *builder.Builder, list client.ObjectList) *builder.Builder
	// AnswerRecheck, when set, is how soon a new instance with an address
	// whose proxy does not answer yet is looked at again, instead of at
	// the not-Ready poll (see answerSoon): for a backend where a read
	// costs no quota (a KVM host), whose guests start Squid at the end of
	// their boot.
	AnswerRecheck time.Duration
}

// Backend describes one backend to the generic layer: the config block it
// reads and how to build its driver. The kinds' controllers, the health
// checks and the orphan sweep read nothing else of a backend.
type Backend struct {
	// Name is the name of the ProviderConfig block (kvm, proxmox, gcp,
	// kubernetes). It names the backend in messages, metrics and the
	// config's status.backend.
	Name string
	// Block returns what the generic layer reads of the config's block of
	// this backend, and false when the config holds none.
	Block func(s *spec.ProviderConfigSpec) (Block, bool)
	// Connect builds the driver for one reconcile from the config. It is
	// called on every Connect, so credentials are re-read each time;
	// drivers pool connections keyed by what they were built from.
	Connect func(ctx context.Context, cfg *Config) (proxy.Driver, error)
}

// Block is what the generic layer reads of a config's backend block: the
// settings it enforces itself, before any driver is involved.
type Block struct {
	// AllowUserCloudInit is the block's allowUserCloudInit (nil: true, as
	// when the backend takes no cloud-init).
	AllowUserCloudInit *bool
	// AllowTenantCloudInit is the block's allowTenantCloudInit: whether a
	// namespaced proxy on this config as a ClusterProviderConfig may bring
	// its own cloud-init (Config.Tenant).
	AllowTenantCloudInit bool
	// GuestReportsAddress says the backend learns an instance's address
	// from its guest (a guest agent, a DHCP lease): a guest running a
	// tenant's content can name any address there (Config.TenantGuest).
	GuestReportsAddress bool
	// ImagesByURL, when set, is whether the block allows images by URL
	// (a backend that takes them), and the catalogue named otherwise.
	ImagesByURL *ImagesByURL
	// CredentialsSource, when set, is the block's credentials.source: a
	// namespaced config may use only Secret (CheckTenancy).
	CredentialsSource *xpv2.CredentialsSource
	// ClusterOnly, when not empty, names a setting of the block that only
	// a cluster-scoped config may make, and why (CheckTenancy refuses it
	// on a namespaced ProviderConfig).
	ClusterOnly string
	// Insecure, when not empty, says which verification the block turns
	// off and what that exposes (the config's Secure condition).
	Insecure string
	// EgressCheck is the block's egressCheck: the echo endpoint each Ready
	// proxy's egress address is verified against (nil: none).
	EgressCheck *spec.EgressCheck
	// Hosts, when not nil, are the hosts the block names (KVM), by name,
	// with their addresses: the orphan sweep remembers what stands on
	// each (Instance.Placement.Location) and reports a host that leaves
	// the block with what stood there.
	Hosts map[string]string
}

// ImagesByURL is a block's allowImageURLs, its allowTenantImageURLs and
// its image catalogue's keys.
type ImagesByURL struct {
	Allowed bool
	// TenantAllowed also lets a tenant's proxy on a ClusterProviderConfig
	// name one.
	TenantAllowed bool
	Keys          []string
}

// Binding is a kind of any parameter type as the provider's Setup sees
// it: a Kind[P].
type Binding interface {
	// Setup registers the kind's controllers of both scopes.
	Setup(mgr ctrl.Manager, o Options, sh *Shared) error
	// Describe returns the kind's backend and its kinds of both scopes.
	Describe() (Backend, []schema.GroupVersionKind)
}

// Setup registers k's controllers of both scopes.
func (k Kind[P]) Setup(mgr ctrl.Manager, o Options, sh *Shared) error {
	return Setup(mgr, o, sh, k)
}

// Describe returns k's backend and kinds.
func (k Kind[P]) Describe() (Backend, []schema.GroupVersionKind) { return k.Backend, k.GVKs }
