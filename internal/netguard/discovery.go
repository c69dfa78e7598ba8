package netguard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Discovery finds the networks of the cluster the provider runs in: the
// kubernetes Service's cluster IPs and its endpoints (the API server),
// the ServiceCIDRs, every node's addresses and spec.podCIDRs, the
// Services' external and load balancer addresses, the API server the
// provider was configured with, and, in a pod, the networks of
// its own interfaces (its node's pod network). What it may not read (no
// rights, an older cluster) is left out: name it with Options.Denied.
type Discovery struct {
	// Reader reads from the API server (uncached: nodes are not cached).
	Reader client.Reader
	// APIServer is the provider's own API server URL (rest.Config.Host).
	APIServer string
	// InCluster adds the networks of the process's own interfaces.
	InCluster bool
	// Services adds the Services' external and load balancer addresses
	// (ReadServices): the provider's own cluster's, for tenants'
	// endpoints.
	Services bool
	// TTL is how long what was read is reused; 30 s when zero.
	TTL time.Duration
	// Retry is how soon a read that failed on the way is tried again; 1 s
	// when zero.
	Retry time.Duration

	mu   sync.Mutex
	at   time.Time
	last map[string][]netip.Prefix
	// settled: every source of the last read answered or was refused for
	// good.
	settled bool
	// known are the sources that answered or were refused for good once;
	// unknown, those that never have.
	known   map[string]bool
	unknown []string
	// unreadable are the sources the last read was refused for good:
	// their networks are unknown, not empty.
	unreadable []string
}

// NewDiscovery returns the Discovery of the cluster reader reads, whose
// API server is at apiServer, with its Services' addresses; in a pod
// (KUBERNETES_SERVICE_HOST set) it adds the pod's own networks.
func NewDiscovery(reader client.Reader, apiServer string) *Discovery {
	return &Discovery{Reader: reader, APIServer: apiServer, InCluster: os.Getenv("KUBERNETES_SERVICE_HOST") != "", Services: true}
}

// Networks implements Networks. A read that fails on the way keeps what
// it read last time and is tried again after Retry, not the TTL (a
// network left out would be left out of every check and proxy until
// then); one refused for good (no rights, no such kind) gives nothing.
func (d *Discovery) Networks(ctx context.Context) []netip.Prefix {
	return d.networks(ctx, true)
}

// Cluster are the networks the cluster itself says are its own
// (ReadCluster), from the same reads as Networks, without the API server's
// configured address and the process's own interfaces: what the provider
// sees of its host is no network of the proxies it runs in the cluster
// (a provider on the host's network would otherwise deny every network
// of the host to them), and without the Services' external addresses.
func (d *Discovery) Cluster() Networks { return clusterOnly{d} }

type clusterOnly struct{ d *Discovery }

var _ Partial = clusterOnly{}

func (c clusterOnly) Networks(ctx context.Context) []netip.Prefix { return c.d.networks(ctx, false) }

// Unreadable implements Partial: what cannot be read of the cluster is
// as unknown to its proxies as to the guard, but for the Services'
// external addresses, which proxies are not denied (Networks).
func (c clusterOnly) Unreadable(ctx context.Context) []string {
	return slices.DeleteFunc(c.d.Unreadable(ctx), func(s string) bool { return s == servicesSource })
}

// Complete implements Complete.
func (c clusterOnly) Complete(ctx context.Context) ([]netip.Prefix, error) {
	return c.d.complete(ctx, false)
}

// Complete implements Complete.
func (d *Discovery) Complete(ctx context.Context) ([]netip.Prefix, error) {
	return d.complete(ctx, true)
}

func (d *Discovery) complete(ctx context.Context, static bool) ([]netip.Prefix, error) {
	nets := d.networks(ctx, static)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.unknown) > 0 {
		return nil, &UnknownError{Sources: slices.Clone(d.unknown)}
	}
	return nets, nil
}

// Complete is a Networks that can tell that some of its networks are not
// known yet: for what is written once and kept (a proxy's squid.conf),
// where a network left out would stay out.
type Complete interface {
	Networks
	// Complete are the networks, or an UnknownError while a source has
	// never answered.
	Complete(ctx context.Context) ([]netip.Prefix, error)
}

// UnknownError says which sources of a cluster's networks have not
// answered yet. It quotes none of their errors: the cluster may be a
// tenant's.
type UnknownError struct{ Sources []string }

func (e *UnknownError) Error() string {
	return "the cluster's networks are not known yet: no answer from its " + strings.Join(e.Sources, ", ")
}

func (d *Discovery) networks(ctx context.Context, static bool) []netip.Prefix {
	d.mu.Lock()
	defer d.mu.Unlock()
	ttl, retry := d.TTL, d.Retry
	if ttl <= 0 {
		ttl = 30 * time.Second
	}
	if retry <= 0 {
		retry = time.Second
	}
	if d.last == nil {
		d.last, d.known = map[string][]netip.Prefix{}, map[string]bool{}
	}
	if since := time.Since(d.at); since >= ttl || (!d.settled && since >= retry) {
		d.settled = d.read(ctx)
		d.at = time.Now()
	}
	var out []netip.Prefix
	for source, ps := range d.last {
		if static || (source != "static" && source != servicesSource) {
			out = append(out, ps...)
		}
	}
	return out
}

// read reads each source into d.last and says whether every one settled;
// d.mu held.
func (d *Discovery) read(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	static, _ := ServerAddresses(ctx, net.DefaultResolver, d.APIServer)
	if h := os.Getenv("KUBERNETES_SERVICE_HOST"); h != "" {
		if a, err := netip.ParseAddr(h); err == nil {
			static = append(static, single(a))
		}
	}
	if d.InCluster {
		static = append(static, ownNetworks()...)
	}
	d.last["static"] = static
	if d.Reader == nil {
		return true
	}
	// A read refused for good gives nothing; one that failed on the way
	// keeps what it gave last time.
	settled := true
	before := d.unreadable
	d.unknown, d.unreadable = nil, nil
	sources := ReadCluster(ctx, d.Reader)
	if d.Services {
		sources = append(sources, ReadServices(ctx, d.Reader))
	}
	for _, src := range sources {
		switch {
		case src.Err == nil:
			d.last[src.Name] = src.Prefixes
			d.known[src.Name] = true
		case src.Settled():
			delete(d.last, src.Name)
			d.known[src.Name] = true
			if src.Unreadable() {
				d.unreadable = append(d.unreadable, src.Name)
			}
		default:
			settled = false
			// Unknown stays unknown until a read says otherwise: a
			// failed read of the nodes tells nothing of the pod network.
			for _, name := range []string{src.Name, podNetworkOf(src.Name)} {
				if name != "" && slices.Contains(before, name) {
					d.unreadable = append(d.unreadable, name)
				}
			}
		}
		if !d.known[src.Name] {
			d.unknown = append(d.unknown, src.Name)
		}
	}
	return settled
}

// ServerAddresses are the addresses of an API server's URL (a
// kubeconfig's server, rest.Config.Host, with or without a scheme): its
// host when that is an address, else what r resolves it to.
func ServerAddresses(ctx context.Context, r Resolver, server string) ([]netip.Prefix, error) {
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	u, err := url.Parse(server)
	if err != nil {
		return nil, err
	}
	if u.Hostname() == "" {
		return nil, errors.New("the API server's URL names no host")
	}
	if a, err := netip.ParseAddr(u.Hostname()); err == nil {
		return []netip.Prefix{single(a)}, nil
	}
	addrs, err := r.LookupNetIP(ctx, "ip", u.Hostname())
	if err != nil {
		return nil, err
	}
	out := make([]netip.Prefix, len(addrs))
	for i, a := range addrs {
		out[i] = single(a)
	}
	return out, nil
}

// Source is what one read of a cluster's networks gave: Prefixes when Err
// is nil.
type Source struct {
	Name     string
	Prefixes []netip.Prefix
	Err      error
}

// Settled says the read answered or was refused for good (no rights, an
// older cluster without the kind): reading again soon would give the same.
func (s Source) Settled() bool {
	return s.Err == nil || kerrors.IsForbidden(s.Err) || kerrors.IsNotFound(s.Err) || apimeta.IsNoMatchError(s.Err) || errors.Is(s.Err, errPodNetworkUnstated)
}

// Unreadable says the read was refused for good in a way that leaves the
// source's networks unknown rather than empty: no rights, a kind the
// cluster does not serve (ServiceCIDRs before Kubernetes 1.33), or a pod
// network the nodes do not state. A missing kubernetes Service is an
// answer: there is none.
func (s Source) Unreadable() bool {
	if s.Err == nil || (s.Name == "service" && kerrors.IsNotFound(s.Err)) {
		return false
	}
	return kerrors.IsForbidden(s.Err) || kerrors.IsNotFound(s.Err) || apimeta.IsNoMatchError(s.Err) || errors.Is(s.Err, errPodNetworkUnstated)
}

// podNetworkSource names the pod network where a node states no pod range.
const podNetworkSource = "pod network"

// podNetworkOf is the source a read of source name also tells of: the
// nodes tell of the pod network.
func podNetworkOf(name string) string {
	if name == "nodes" {
		return podNetworkSource
	}
	return ""
}

// errPodNetworkUnstated is the "pod network" source of a cluster with a
// node that states no pod range: its CNI assigns pod addresses by itself
// (Calico's IPAM, Cilium's cluster pool, a cloud's VPC addresses), so the
// pod network is unknown, not empty.
var errPodNetworkUnstated = errors.New("a node states no pod range (spec.podCIDRs)")

// Unreadable implements Partial: the sources of the cluster's networks
// the last read was refused for good (Source.Unreadable).
func (d *Discovery) Unreadable(ctx context.Context) []string {
	d.networks(ctx, true)
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.unreadable)
}

// ReadCluster reads the networks a cluster says are its own, one Source
// each: the kubernetes Service's cluster IPs ("service"), the API server's
// endpoint addresses ("endpoints"), the ServiceCIDRs ("servicecidrs"), and
// every node's pod ranges and internal and external addresses ("nodes"),
// with "pod network" unreadable where a node states no pod range.
// Four requests through r. The lists are answered from the API server's
// watch cache (resourceVersion 0), not read from etcd: they repeat every
// TTL, and a big cluster's nodes are a large read.
func ReadCluster(ctx context.Context, r client.Reader) []Source {
	svc := &corev1.Service{}
	err := r.Get(ctx, types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: "kubernetes"}, svc)
	out := []Source{{Name: "service", Err: err, Prefixes: parse(svc.Spec.ClusterIPs)}}

	eps := &discoveryv1.EndpointSliceList{}
	err = r.List(ctx, eps, fromWatchCache(), client.InNamespace(metav1.NamespaceDefault), client.MatchingLabels{discoveryv1.LabelServiceName: "kubernetes"})
	var addrs []string
	for _, s := range eps.Items {
		for _, e := range s.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
	}
	out = append(out, Source{Name: "endpoints", Err: err, Prefixes: parse(addrs)})

	cidrs := &networkingv1.ServiceCIDRList{}
	err = r.List(ctx, cidrs, fromWatchCache())
	var cs []string
	for _, c := range cidrs.Items {
		cs = append(cs, c.Spec.CIDRs...)
	}
	out = append(out, Source{Name: "servicecidrs", Err: err, Prefixes: parse(cs)})

	nodes := &corev1.NodeList{}
	err = r.List(ctx, nodes, fromWatchCache())
	var ns []string
	unstated := false
	for _, n := range nodes.Items {
		unstated = unstated || len(n.Spec.PodCIDRs) == 0 && n.Spec.PodCIDR == ""
		ns = append(ns, n.Spec.PodCIDRs...)
		if n.Spec.PodCIDR != "" {
			ns = append(ns, n.Spec.PodCIDR)
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				ns = append(ns, a.Address)
			}
		}
	}
	out = append(out, Source{Name: "nodes", Err: err, Prefixes: parse(ns)})
	if err == nil && unstated {
		out = append(out, Source{Name: podNetworkSource, Err: errPodNetworkUnstated})
	}

	return out
}

// ReadServices reads every Service's external IPs and load balancer
// addresses ("services"), one list through r from the watch cache:
// kube-proxy sends a pod's connection to them straight to the Service's
// pods, so they are the cluster's own, public or not.
func ReadServices(ctx context.Context, r client.Reader) Source {
	svcs := &corev1.ServiceList{}
	err := r.List(ctx, svcs, fromWatchCache())
	var ext []string
	for _, sv := range svcs.Items {
		ext = append(ext, sv.Spec.ExternalIPs...)
		if sv.Spec.LoadBalancerIP != "" {
			ext = append(ext, sv.Spec.LoadBalancerIP)
		}
		for _, in := range sv.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				ext = append(ext, in.IP)
			}
		}
	}
	return Source{Name: servicesSource, Err: err, Prefixes: parse(ext)}
}

// servicesSource names the Services' external and load balancer
// addresses: refused to tenants' endpoints, not written into a PodProxy's
// denials (Cluster), which would change with every load balancer.
const servicesSource = "services"

// fromWatchCache has a list answered from the API server's watch cache.
// A new one each time: the client writes the list's selectors into Raw.
func fromWatchCache() client.ListOption {
	return &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}}
}

// ownNetworks are the networks of the process's interfaces, loopback
// aside (the guard refuses it anyway).
func ownNetworks() []netip.Prefix {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range as {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.IsLoopback() {
			continue
		}
		if p, err := netip.ParsePrefix(n.String()); err == nil {
			out = append(out, canonical(p))
		}
	}
	return out
}

func single(a netip.Addr) netip.Prefix {
	a = a.Unmap().WithZone("")
	return netip.PrefixFrom(a, a.BitLen())
}

// parse reads CIDRs and addresses, skipping what does not parse.
func parse(ss []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, canonical(p))
		} else if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, single(a))
		}
	}
	return out
}
