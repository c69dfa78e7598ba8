// Package kubernetes is the PodProxy backend: Squid as a Deployment in a
// Kubernetes cluster (the provider's own, or another one reached with a
// kubeconfig).
//
// Objects per proxy, all named after the instance, in the config's
// namespace, all labelled with the ownership mark (see Label*):
//
//	Deployment  the root: replicas of Squid (one by default), non-root,
//	            read-only root filesystem, no capabilities, RuntimeDefault
//	            seccomp; two or more spread over nodes
//	Secret      squid.conf and htpasswd, mounted into the pod;
//	            ownerReference to the Deployment
//	NetworkPolicy  optional (the config's networkPolicy); ownerReference
//	            to the Deployment
//	Service     optional (ClusterIP or LoadBalancer); ownerReference to the
//	            Deployment
//	PodDisruptionBudget  with two or more replicas; ownerReference to the
//	            Deployment
//
// A Secret or Service of the name that is not this proxy's (no mark,
// another mark, another controller) is never written, owned or deleted:
// Create checks before the Deployment exists and fails naming it, and every
// later write refuses it the same way (writeChild).
//
// Deleting the Deployment deletes the rest (the garbage collector follows
// the ownerReferences); the Secret and NetworkPolicy go just before it, by
// the proxy's mark, where the cluster grants that. It goes in the background when its pod is known,
// and Get of the resource being deleted reports the proxy until no pod of
// it remains; otherwise in the foreground, and the Deployment stays until
// its ReplicaSet and pods are gone (see Delete). Either way Get never
// reports NotFound to a resource being deleted while its pod remains.
//
// The seam is controller-runtime's client.Client. For the provider's own
// cluster, reads go through the manager's cache (see CacheByObject), so
// Get costs no API request; a remote cluster is read directly.
package kubernetes

import (
	"context"
	"maps"
	"net"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// FieldOwner is the field manager of everything the driver writes.
const FieldOwner = "provider-egressproxy"

// secretCheckAfter is how long after its creation a Deployment without a
// serving pod has its Secret checked for.
const secretCheckAfter = 30 * time.Second

// childrenMissing is the SpecHash Get reports for a proxy missing its
// Secret, Service or NetworkPolicy: it matches no request's hash.
const childrenMissing = "children-missing"

// Options configure a Driver.
type Options struct {
	// Provider is the configured name of the backend (the ProviderConfig's,
	// such as "ClusterProviderConfig pods"); every error carries it.
	Provider string
	// Config is the kubernetes block of the ProviderConfig.
	Config Config
	// Client reads and writes. Its reads may be served by a cache that holds
	// the labelled objects (CacheByObject).
	Client client.Client
	// Live, when set, reads from the API server directly. Set it when
	// Client's reads are cached: Get falls back to it when the cache has no
	// Deployment (one just created, or one a human made without the
	// labels), and Create reads through it what it collides with.
	Live client.Reader
	// Version returns the API server's version, for Check.
	Version func(ctx context.Context) (string, error)
	// Host is the API server's address, for Check.
	Host string
	// Prober checks that Squid with the proxy's own configuration answers;
	// nil uses one of its own.
	Prober *squid.Prober
	// DialPods says the provider can reach pod addresses (it runs in the
	// target cluster): the proxy is checked at its pod's address. Otherwise
	// (a remote cluster) a LoadBalancer Service's address is checked, and
	// without one the pod's readiness probe, a TCP connect to the proxy
	// port from its node, stands for the check.
	DialPods bool
	// PodLog reads a container's log: where the provider reaches neither
	// the pods nor a load balancer, the pods check their egress address
	// themselves and print it there. Nil: not read.
	PodLog PodLogFunc
	// Log, when set, receives the driver's log lines; otherwise they go to
	// the logger in the call's context (controller-runtime puts the
	// reconcile's there).
	Log *logr.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Networks, when set, are the cluster's own networks as another part
	// of the provider already discovers them (the tenant guard's, for the
	// provider's own cluster); nil: the driver reads them (clusterNetworks).
	Networks netguard.Networks
}

// Driver is the kubernetes proxy.Driver.
type Driver struct {
	// quiet: errors never quote the API server's messages (a tenant's
	// cluster).
	quiet bool
	// guard checks and dials the addresses the cluster reports (a
	// tenant's cluster); nil otherwise.
	guard    *netguard.Guard
	provider string
	cfg      Config
	client   client.Client
	live     client.Reader
	version  func(ctx context.Context) (string, error)
	host     string
	prober   *squid.Prober
	dialPods bool
	podLog   PodLogFunc
	networks netguard.Networks
	// resolver resolves the API server's name (serverNetworks).
	resolver netguard.Resolver
	log      *logr.Logger
	now      func() time.Time
	// gone, when set, are the Deployments the cache's watch saw deleted.
	gone *gone
	// taken are the names whose Create was refused (the Cluster's).
	taken *taken
	// unfinished are the proxies whose Create made the Deployment but not
	// all its children (the Cluster's; the driver's own when made by New).
	unfinished *taken
	// absent are the children List found missing, per proxy (the
	// Cluster's; the driver's own when made by New).
	absent *absent
	// refused are where the cluster refused a deletecollection (the
	// Cluster's; the driver's own when made by New).
	refused *refused
	// podIndex: the client's cache indexes pods by podUIDIndex.
	podIndex bool
}

var _ proxy.Driver = (*Driver)(nil)

// defaultResolver resolves the API server's name; the package's tests
// put one in its place that sends no query.
var defaultResolver netguard.Resolver = net.DefaultResolver

// New returns a driver for o.
func New(o Options) *Driver {
	d := &Driver{
		provider:   o.Provider,
		cfg:        o.Config.withDefaults(),
		client:     o.Client,
		live:       o.Live,
		version:    o.Version,
		host:       o.Host,
		prober:     o.Prober,
		dialPods:   o.DialPods,
		podLog:     o.PodLog,
		networks:   o.Networks,
		resolver:   defaultResolver,
		log:        o.Log,
		now:        o.Now,
		refused:    &refused{},
		unfinished: &taken{},
		absent:     &absent{},
	}
	if d.live == nil {
		d.live = o.Client
	}
	if d.prober == nil {
		d.prober = &squid.Prober{}
	}
	if d.now == nil {
		d.now = time.Now
	}
	return d
}

func (d *Driver) logger(ctx context.Context) logr.Logger {
	if d.log != nil {
		return telemetry.Logger(ctx, *d.log)
	}
	return telemetry.Logger(ctx, logr.FromContextOrDiscard(ctx).WithName("kubernetes"))
}

// wrap classifies err and names the provider and the operation.
func (d *Driver) wrap(err error, op string) error {
	return proxy.WithContext(classify(d.quietly(err)), d.provider, op)
}

// quietly is err without what a tenant's API server said (quietStatus,
// netguard.Quiet), for a tenant's cluster; err itself otherwise.
func (d *Driver) quietly(err error) error {
	if !d.quiet || err == nil {
		return err
	}
	return quietStatus(err)
}

// owned refuses to act on a Deployment without our mark, or with another
// resource's mark (UID or installation) when the caller knows its own.
func owned(dep *appsv1.Deployment, m proxy.Mark, verb string) error {
	got := markOf(dep)
	switch {
	case got.UID == "" || dep.Labels[LabelManagedBy] != ManagedBy:
		return proxy.Permanentf("Deployment %s/%s carries no ownership mark of provider-egressproxy; refusing to %s it", dep.Namespace, dep.Name, verb)
	case m.UID != "" && got != m:
		return proxy.Permanentf("Deployment %s/%s belongs to another resource (UID %s, installation %q); refusing to %s it", dep.Namespace, dep.Name, got.UID, got.InstallationID, verb)
	}
	return nil
}

// markOf is the ownership mark dep carries.
func markOf(dep *appsv1.Deployment) proxy.Mark {
	return proxy.Mark{UID: dep.Labels[LabelUID], InstallationID: dep.Labels[LabelInstallation]}
}

func merged(base, over map[string]string) map[string]string {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, over)
	return out
}

// cached says the driver's reads go through a cache (Options.Live is set
// apart from Options.Client).
func (d *Driver) cached() bool { return d.live != client.Reader(d.client) }
