package kubernetes

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// clusterNetworks are the target cluster's own networks, which a PodProxy
// never reaches (its resource cannot open them): the config's
// ClusterNetworks, the API server the driver was given (serverNetworks),
// the kubernetes Service's cluster IPs, the API server's endpoint
// addresses, the cluster's ServiceCIDRs, its pod network as the nodes'
// podCIDRs say it and the nodes' own addresses (their kubelets,
// host-network pods and NodePorts). unknown names the sources that cannot
// be read (no rights, an older cluster, a network plugin that assigns pod
// addresses itself and leaves podCIDRs empty, a server name that does not
// resolve): their networks are unknown, not empty (deniedNetworks).
// Adjacent ranges are merged (a node's /24s become the /16 they fill), so
// squid.conf stays short on a big cluster. Until every source has
// answered once it is an UnknownError, and nothing is written: a network
// left out of squid.conf would stay out until the proxy is next updated.
func (d *Driver) clusterNetworks(ctx context.Context) (nets, unknown []string, err error) {
	discovered, unknown, err := d.discoveredNetworks(ctx)
	if err != nil {
		return nil, nil, proxy.Transientf("%v", err)
	}
	server, ok := d.serverNetworks(ctx)
	if !ok {
		unknown = append(unknown, apiServerSource)
	}
	var out []netip.Prefix
	for _, c := range d.cfg.ClusterNetworks {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked())
		} else if a, err := netip.ParseAddr(c); err == nil {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		}
	}
	out = joinPrefixes(slices.Concat(out, discovered, server))
	nets = make([]string, len(out))
	for i, p := range out {
		nets[i] = p.String()
	}
	return nets, unknown, nil
}

// deniedNetworks are the cluster's networks a proxy of req denies. While
// some of them are unknown, the private ranges req opens may hold them (a
// pod network in 10.0.0.0/8), so such a request is refused, naming what
// cannot be read and how to fix it, unless the config names the cluster's
// networks (ClusterNetworks stands in for what cannot be read). A proxy
// that opens no private range denies them all and is written.
func (d *Driver) deniedNetworks(ctx context.Context, req proxy.Request) ([]string, error) {
	nets, unknown, err := d.clusterNetworks(ctx)
	if err != nil || len(unknown) == 0 || len(req.Proxy.AllowedDestinationCIDRs) == 0 || len(d.cfg.ClusterNetworks) > 0 {
		return nets, err
	}
	why, grants := whyUnknown(unknown)
	ways := "name the cluster's pod, Service and node networks in spec.kubernetes.clusterNetworks"
	if grants {
		ways = "grant the reads (cluster/rbac/podproxy.yaml), or " + ways
	}
	return nil, plainly(proxy.ClassPermanent, "spec.forProvider.proxy.allowedDestinationCIDRs opens %s, where the target cluster's own networks may lie, and they are not all known: %s. "+
		"A PodProxy never reaches them, so it opens no private range until they are: %s",
		strings.Join(req.Proxy.AllowedDestinationCIDRs, ", "), why, ways)
}

// apiServerSource is the source of the API server's address when its name
// does not resolve.
const apiServerSource = "API server"

// reads are the grants each source of the cluster's networks needs.
var reads = map[string]string{
	"service":      "get the Service default/kubernetes",
	"endpoints":    "list endpointslices (discovery.k8s.io) in default",
	"servicecidrs": "list servicecidrs (networking.k8s.io; a cluster before Kubernetes 1.33 has none)",
	"nodes":        "list nodes",
}

// whyUnknown says why the sources named are unknown, in the provider's own
// words, and whether a grant would make some known.
func whyUnknown(unknown []string) (_ string, grant bool) {
	var grants, why []string
	for _, s := range unknown {
		switch s {
		case apiServerSource:
			why = append(why, "the API server's name does not resolve here")
		case "pod network":
			why = append(why, "a node states no pod range (spec.podCIDRs: its network plugin assigns pod addresses itself)")
		default:
			if g, ok := reads[s]; ok {
				grants = append(grants, g)
			} else {
				why = append(why, s+" cannot be read")
			}
		}
	}
	if len(grants) > 0 {
		why = append([]string{"the provider may not " + strings.Join(grants, ", ")}, why...)
	}
	return strings.Join(why, "; "), len(grants) > 0
}

// serverNetworks are the addresses of the API server the driver was given
// (a kubeconfig's server; in the cluster, the kubernetes Service's
// address): on a managed cluster it is a load balancer the kubernetes
// Service's endpoints do not name. A name is resolved once per
// networksTTL, or a second after a lookup failed; while it does not
// resolve, the last answer stands, and without one ok is false.
func (d *Driver) serverNetworks(ctx context.Context) (_ []netip.Prefix, ok bool) {
	if d.host == "" {
		return nil, true
	}
	discovered.mu.Lock()
	s, seen := discovered.servers[d.host]
	discovered.mu.Unlock()
	if seen && (time.Since(s.at) < networksTTL && !s.failed || time.Since(s.at) < time.Second) {
		return s.nets, s.ok
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nets, err := netguard.ServerAddresses(ctx, d.resolver, d.host)
	if err != nil {
		s.at, s.failed = time.Now(), true
	} else {
		s = serverAddresses{at: time.Now(), nets: nets, ok: true}
	}
	discovered.mu.Lock()
	discovered.servers[d.host] = s
	discovered.mu.Unlock()
	return s.nets, s.ok
}

// serverAddresses are what the last lookup of an API server's name gave.
type serverAddresses struct {
	at   time.Time
	nets []netip.Prefix
	// ok: a lookup answered once; failed: the last one did not.
	ok, failed bool
}

// joinPrefixes sorts ps and drops every prefix another covers, then joins the
// two halves of a prefix into it until none are left: the same addresses,
// in as few prefixes as they take.
func joinPrefixes(ps []netip.Prefix) []netip.Prefix {
	for {
		slices.SortFunc(ps, func(a, b netip.Prefix) int {
			if c := a.Addr().Compare(b.Addr()); c != 0 {
				return c
			}
			return a.Bits() - b.Bits()
		})
		ps = slices.Compact(ps)
		var out []netip.Prefix
		joined := false
		for _, p := range ps {
			if n := len(out); n > 0 {
				last := out[n-1]
				switch {
				case last.Addr().Is4() == p.Addr().Is4() && last.Bits() <= p.Bits() && last.Contains(p.Addr()):
					continue // covered
				case last.Bits() == p.Bits() && last.Bits() > 0 && last.Addr().Is4() == p.Addr().Is4():
					if up := netip.PrefixFrom(last.Addr(), last.Bits()-1).Masked(); up == netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked() {
						out[n-1], joined = up, true
						continue
					}
				}
			}
			out = append(out, p)
		}
		if !joined {
			return out
		}
		ps = out
	}
}

// networksTTL is how long a cluster's discovered networks are reused. A
// Create reads them twice (squid.conf and NetworkPolicy), so without it
// every Create would cost several discovery requests; they change when an
// administrator adds a ServiceCIDR or moves the API server and when a node
// joins, and such a change reaches the squid.conf and NetworkPolicy a
// proxy is written with within the TTL.
const networksTTL = 30 * time.Second

// discovered are the discovered networks of each cluster, by the API
// server's address, for every driver of the process, and the reads in
// flight: the creates that start together (50 at once after a burst of
// new proxies) wait for one read instead of each sending their own.
var discovered = struct {
	mu     sync.Mutex
	m      map[string]discoveredNetworks
	flight map[string]chan struct{}
	// servers are the API servers' addresses (serverNetworks).
	servers map[string]serverAddresses
}{m: map[string]discoveredNetworks{}, flight: map[string]chan struct{}{}, servers: map[string]serverAddresses{}}

type discoveredNetworks struct {
	at   time.Time
	nets []netip.Prefix
	// unreadable are the sources refused for good whose networks are
	// unknown, not empty (netguard.Source.Unreadable).
	unreadable []string
}

// discoveredNetworks are the networks the cluster says are its own
// (netguard.ReadCluster), and the sources of them that cannot be read:
// from the Cluster's Networks where another part of the provider already
// discovers them, else read here, or reused when read within networksTTL.
func (d *Driver) discoveredNetworks(ctx context.Context) (nets []netip.Prefix, unreadable []string, err error) {
	if d.networks != nil {
		if c, ok := d.networks.(netguard.Complete); ok {
			nets, err = c.Complete(ctx)
		} else {
			nets = d.networks.Networks(ctx)
		}
		if p, ok := d.networks.(netguard.Partial); ok && err == nil {
			unreadable = p.Unreadable(ctx)
		}
		return nets, unreadable, err
	}
	key := d.host
	if key == "" {
		key = d.provider
	}
	waited := false
	for {
		discovered.mu.Lock()
		c, ok := discovered.m[key]
		if ok && time.Since(c.at) < networksTTL {
			discovered.mu.Unlock()
			return c.nets, c.unreadable, nil
		}
		ch, busy := discovered.flight[key]
		if !busy || waited {
			done := make(chan struct{})
			if !busy {
				discovered.flight[key] = done
			}
			discovered.mu.Unlock()
			defer func() {
				if !busy {
					discovered.mu.Lock()
					delete(discovered.flight, key)
					discovered.mu.Unlock()
					close(done)
				}
			}()
			return d.readNetworks(ctx, key)
		}
		discovered.mu.Unlock()
		// Another read is on its way: wait for it once, then read here
		// if it kept nothing (it failed on the way).
		select {
		case <-ch:
		case <-ctx.Done():
		}
		waited = true
	}
}

// readNetworks reads the cluster's networks and keeps them under key when
// every read settled. A read that failed on the way gives what it read
// with what was kept last time, or an UnknownError when nothing was.
func (d *Driver) readNetworks(ctx context.Context, key string) ([]netip.Prefix, []string, error) {
	var nets []netip.Prefix
	var failed, unreadable []string
	for _, src := range netguard.ReadCluster(ctx, d.live) {
		nets = append(nets, src.Prefixes...)
		switch {
		case src.Unreadable():
			unreadable = append(unreadable, src.Name)
		case !src.Settled():
			failed = append(failed, src.Name)
		}
	}
	discovered.mu.Lock()
	defer discovered.mu.Unlock()
	// Kept only when every read answered or was refused for good (no
	// rights, an older cluster): a read that failed on the way must not
	// leave a network out of the proxies created for the whole TTL.
	if len(failed) == 0 {
		discovered.m[key] = discoveredNetworks{at: time.Now(), nets: nets, unreadable: unreadable}
		return nets, unreadable, nil
	}
	last, ok := discovered.m[key]
	if !ok {
		return nil, nil, &netguard.UnknownError{Sources: failed}
	}
	// What could not be read last time is no better known now.
	return append(slices.Clone(last.nets), nets...), compactStrings(slices.Concat(last.unreadable, unreadable)), nil
}

// buildNetworkPolicy says below Squid what Squid denies, where the cluster
// enforces NetworkPolicies: the proxy's pods may send DNS anywhere, and
// anything else only outside the ranges Squid denies (squid.Denied: never,
// private and the cluster's networks, in every spelling Squid checks),
// plus the private ranges the resource opened, without the never ranges
// inside them; an opened range inside a never range (a Service network in
// 10.0.0.0/8) is not opened at all. It only narrows egress; ingress is
// Squid's (clients arrive through load balancers that may not keep their
// address).
func buildNetworkPolicy(dep *appsv1.Deployment, req proxy.Request, cluster []string) *networkingv1.NetworkPolicy {
	never, private := squid.Denied(cluster)
	var opened []netip.Prefix
	for _, c := range req.Proxy.AllowedDestinationCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			p = p.Masked()
			if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
			}
			opened = append(opened, p)
		}
	}
	// within are the prefixes of ps strictly inside outer (an except must
	// be); covered says one of ps holds all of p.
	within := func(outer netip.Prefix, ps []netip.Prefix) []string {
		var out []string
		for _, p := range ps {
			if p.Addr().Is4() == outer.Addr().Is4() && p.Bits() > outer.Bits() && outer.Contains(p.Addr()) {
				out = append(out, p.String())
			}
		}
		return compactStrings(out)
	}
	covered := func(p netip.Prefix, ps []netip.Prefix) bool {
		return slices.ContainsFunc(ps, func(q netip.Prefix) bool {
			return q.Addr().Is4() == p.Addr().Is4() && q.Bits() <= p.Bits() && q.Contains(p.Addr())
		})
	}
	all := append(slices.Clone(never), private...)
	var to []networkingv1.NetworkPolicyPeer
	for _, world := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		to = append(to, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: world.String(), Except: within(world, all)}})
	}
	for _, o := range opened {
		if covered(o, never) {
			continue
		}
		to = append(to, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: o.String(), Except: within(o, never)}})
	}
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	dns := intstr.FromInt32(53)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name: dep.Name, Namespace: dep.Namespace,
			Labels:          markLabels(req),
			OwnerReferences: []metav1.OwnerReference{ownerRef(dep)},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: selectorLabels(req)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}}},
				{To: to},
			},
		},
	}
}

// compactStrings sorts and dedupes.
func compactStrings(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}
