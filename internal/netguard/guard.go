// Package netguard is the dialer of every connection the provider makes
// to an endpoint a tenant chose: a namespaced ProviderConfig's API URL,
// kubeconfig server, hypervisor hosts, the URLs of a key file, image URLs
// (a proxy's own on any config), every redirect, and the address a guest
// a tenant writes reports on the platform's config. It checks each
// address at connect time, after name resolution, and refuses the
// provider's own position in the network (loopback, link-local and
// metadata, multicast, the cluster's own networks) in every spelling of
// an address, unless the platform team allows a range for tenants.
//
// A nil *Guard checks nothing: it is the dialer of the platform team's
// own configs and guests.
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// ReasonRefused is the reason of the error of a refused endpoint.
const ReasonRefused = "EndpointRefused"

// Networks returns the cluster's own networks (Service and pod CIDRs,
// node and API server addresses) as far as they are known.
type Networks interface {
	Networks(ctx context.Context) []netip.Prefix
}

// Partial is a Networks that can tell which of its sources it may not
// read at all (no rights, a kind the cluster does not serve): their
// networks are unknown for good, not empty.
type Partial interface {
	Networks
	Unreadable(ctx context.Context) []string
}

// Options configure a Guard.
type Options struct {
	// Allowed are the ranges the platform team opens for tenants. An
	// address inside one is never refused, except a cloud metadata
	// address, which only an entry of that single address opens.
	Allowed []netip.Prefix
	// Denied are more ranges to refuse. They stand in for no cluster
	// network discovery cannot read.
	Denied []netip.Prefix
	// ServiceCIDRs and PodCIDRs are the cluster's Service and pod networks
	// as the platform team names them: refused, and each stands in for
	// the sources of its network discovery cannot read (ServiceCIDRs for
	// "service" and "servicecidrs", PodCIDRs for "pod network"). While a
	// source is unreadable (Partial) and nothing stands in for it, every
	// private range is refused in its place.
	ServiceCIDRs, PodCIDRs []netip.Prefix
	// ContentAllowed are the ranges the platform team opens for tenants'
	// downloads (ForContent), a private mirror's: a content guard refuses
	// every address that is not public unless one of these holds it.
	ContentAllowed []netip.Prefix
	// Log is told once each time the set of unreadable sources nothing
	// stands in for changes.
	Log logr.Logger
	// Cluster are the discovered cluster networks; nil: none.
	Cluster Networks
	// Resolver resolves names; net.DefaultResolver when nil.
	Resolver Resolver
	// Timeout of one TCP connect; 10 s when zero.
	Timeout time.Duration
}

// Guard refuses connections to addresses a tenant must not make the
// provider reach. Safe for concurrent use.
type Guard struct {
	allowed []netip.Prefix
	denied  []netip.Prefix
	// named are the networks the platform team names (Options.ServiceCIDRs,
	// PodCIDRs); standsIn, the unreadable sources they stand in for.
	named    []netip.Prefix
	standsIn map[string]bool
	cluster  Networks
	resolver Resolver
	timeout  time.Duration
	warn     *warning
	// content: the guard of downloads whose bytes reach a tenant, which
	// refuses every address that is not public; contentAllowed are what
	// it allows (Options.ContentAllowed).
	content        bool
	contentAllowed []netip.Prefix
}

// warning logs the unreadable sources once per change.
type warning struct {
	log  logr.Logger
	mu   sync.Mutex
	last string
}

func (w *warning) note(uncovered []string) {
	if w == nil {
		return
	}
	key := strings.Join(uncovered, ", ")
	w.mu.Lock()
	defer w.mu.Unlock()
	if key == w.last {
		return
	}
	w.last = key
	if key == "" {
		w.log.Info("the cluster's networks are known again: tenants' endpoints in private ranges outside them are allowed")
		return
	}
	w.log.Info("the cluster's networks cannot all be read: every private range is refused for tenants' endpoints until they can be or are named", "unknown", uncovered, "why", whyUnreadable(uncovered))
}

// Resolver resolves a name to its addresses (*net.Resolver is one).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// New returns a Guard.
func New(o Options) *Guard {
	g := &Guard{cluster: o.Cluster, resolver: o.Resolver, timeout: o.Timeout, standsIn: map[string]bool{}, warn: &warning{log: o.Log}}
	for _, p := range o.Allowed {
		g.allowed = append(g.allowed, canonical(p))
	}
	for _, p := range o.Denied {
		g.denied = append(g.denied, canonical(p))
	}
	for _, p := range o.ContentAllowed {
		g.contentAllowed = append(g.contentAllowed, canonical(p))
	}
	for _, p := range append(slices.Clone(o.ServiceCIDRs), o.PodCIDRs...) {
		g.named = append(g.named, canonical(p))
	}
	if len(o.ServiceCIDRs) > 0 {
		g.standsIn["service"], g.standsIn["servicecidrs"] = true, true
	}
	if len(o.PodCIDRs) > 0 {
		g.standsIn[podNetworkSource] = true
	}
	if g.resolver == nil {
		g.resolver = net.DefaultResolver
	}
	if g.timeout <= 0 {
		g.timeout = 10 * time.Second
	}
	return g
}

// ParseCIDRs parses a list of CIDRs or bare addresses (a flag's value),
// naming flag in the error.
func ParseCIDRs(flag string, values []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range values {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, canonical(p))
			continue
		}
		a, err := netip.ParseAddr(v)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("%s: %q is not a CIDR or an IP address", flag, v)
		}
		out = append(out, canonical(netip.PrefixFrom(a, a.BitLen())))
	}
	return out, nil
}

// canonical masks p and writes an IPv4-mapped prefix as IPv4.
func canonical(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// metadata are the clouds' metadata and host-service addresses: as
// denials of one address, only an allowed entry of exactly that address
// opens them, never a range around them.
var metadata = prefixes(
	"169.254.169.254/32", // AWS, GCP, Azure, OpenStack, Oracle
	"169.254.170.2/32",   // AWS ECS task metadata
	"100.100.100.200/32", // Alibaba Cloud
	"168.63.129.16/32",   // Azure WireServer
	"192.0.0.192/32",     // Oracle Cloud
	"fd00:ec2::254/128",  // AWS over IPv6
	"fd00:ec2::23/128",   // AWS DNS over IPv6
	"fd20:ce::254/128",   // GCP over IPv6
)

// private are the ranges a cluster's own networks are drawn from: refused
// in their place while those networks cannot be read and the platform
// team has not named them (Options.ServiceCIDRs, PodCIDRs).
var private = prefixes(
	"10.0.0.0/8",
	"172.16.0.0/12",
	"192.168.0.0/16",
	"100.64.0.0/10", // shared address space (CGNAT), used for pod networks
	"fc00::/7",
)

// special are the IPv4 ranges that are not public (IANA's special-purpose
// registry, those not globally reachable) beyond never's and private's:
// a tenant's download reads none of them.
var special = prefixes(
	"192.0.0.0/24",    // IETF protocol assignments
	"192.0.2.0/24",    // documentation
	"192.88.99.0/24",  // 6to4 relay anycast, deprecated
	"198.18.0.0/15",   // benchmarking
	"198.51.100.0/24", // documentation
	"203.0.113.0/24",  // documentation
)

// notGlobal6 are the IPv6 addresses outside global unicast (2000::/3),
// and its special-purpose ranges: an IPv6 address that spells no IPv4
// address is public only outside them.
var notGlobal6 = prefixes(
	"::/3", "4000::/2", "8000::/1",
	"2001::/23",     // IETF protocol assignments (Teredo, ORCHID...)
	"2001:db8::/32", // documentation
	"3fff::/20",     // documentation
)

// nonPublic4 are the IPv4 addresses a content guard refuses (with never's
// and notGlobal6): the private and special ranges.
var nonPublic4 = append(prefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"), special...)

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

// never are refused whatever they embed: Squid's never-list (loopback,
// "this network", link-local, metadata, multicast, reserved, broadcast,
// the IPv4-compatible ::/96) and the IPv6 spellings whose IPv4 address
// cannot be read off the address: local-use NAT64 (RFC 8215, the IPv4
// address at a position the network chooses) and Teredo (the address
// obfuscated).
var never = append(slices.Clone(squid.NeverDestinations),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2001::/32"),
)

// why are the words of a refusal, by what the address is.
const (
	whyLocal   = "a loopback, unspecified, link-local, metadata, multicast or reserved address"
	whyCluster = "an address of the provider's own cluster (its Service, pod or node networks, or its API server)"
	whyDenied  = "an address the platform team denies to tenants"
	whyContent = "not a public address (private, shared, documentation, benchmarking or another special-purpose range), and a tenant's download reads only public addresses: the platform team can allow a private mirror's range with --tenant-content-allowed-cidrs"
)

// whyUnreadable says why a private address is refused while the
// cluster's networks named cannot be read, and the ways out.
func whyUnreadable(sources []string) string {
	var unread []string
	unstated, service, nodes := false, false, false
	for _, s := range sources {
		switch s {
		case podNetworkSource:
			unstated = true
			continue
		case "service", "servicecidrs":
			service = true
		case "nodes":
			nodes = true
		}
		unread = append(unread, s)
	}
	why := "a private address, and the provider may not read its own cluster's networks (" + strings.Join(unread, ", ") + ")"
	var ways []string
	switch {
	case unstated && len(unread) == 0:
		why = "a private address, and a node of the provider's own cluster states no pod range (spec.podCIDRs), so its pod network is unknown"
	case unstated:
		why += " nor its pod network (a node states no spec.podCIDRs)"
	}
	if len(unread) > 0 {
		ways = append(ways, "grant the reads (cluster/rbac/podproxy.yaml)")
	}
	if service {
		ways = append(ways, "name the Service network with --tenant-endpoint-service-cidrs")
	}
	if unstated || nodes {
		ways = append(ways, "name the pod network with --tenant-endpoint-pod-cidrs")
	}
	ways = append(ways, "allow a range with --tenant-endpoint-allowed-cidrs")
	last := len(ways) - 1
	return why + " to tell them apart: the platform team can " + strings.Join(ways[:last], ", ") + ", or " + ways[last]
}

// known are the networks a check is made against: the cluster's, and
// the sources of them that cannot be read and nothing stands in for.
type known struct {
	cluster    []netip.Prefix
	unreadable []string
}

// embedded returns the IPv4 address an IPv6 address spells, and whether
// it spells one: IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible
// (::a.b.c.d, but for :: and ::1), NAT64's well-known prefix (64:ff9b::/96) and 6to4
// (2002:aabb:ccdd::/48).
func embedded(a netip.Addr) (netip.Addr, bool) {
	if a.Is4() {
		return a, true
	}
	if a.Is4In6() {
		return a.Unmap(), true
	}
	b := a.As16()
	switch {
	case netip.MustParsePrefix("::/96").Contains(a) && !netip.MustParsePrefix("::/127").Contains(a):
		// :: and ::1 are themselves, not 0.0.0.0 and 0.0.0.1.
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case netip.MustParsePrefix("64:ff9b::/96").Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case netip.MustParsePrefix("2002::/16").Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// Check returns an error when a must not be connected to: a Permanent
// proxy.Error (reason EndpointRefused) saying why, or nil; Transient
// while the cluster's networks are not known yet (clusterNetworks).
func (g *Guard) Check(ctx context.Context, a netip.Addr) error {
	if g == nil {
		return nil
	}
	k, err := g.clusterNetworks(ctx)
	if err != nil {
		return err
	}
	if why := g.refuse(a, k); why != "" {
		return refused(a.String(), a.WithZone("").String()+" is "+why)
	}
	return nil
}

// refuse returns why a is refused, or "". Each spelling of a is judged
// on its own, and the most specific entry decides: an allowed range opens
// what it holds unless a denial inside it is more specific, so allowing
// 10.0.0.0/8 does not open a cluster's 10.244.0.0/16, and a metadata
// address (a /32 or /128 denial) opens only by naming it.
func (g *Guard) refuse(a netip.Addr, k known) string {
	a = a.WithZone("")
	spellings := []netip.Addr{a.Unmap()}
	if v4, ok := embedded(a); ok && v4 != spellings[0] {
		spellings = append(spellings, v4)
	}
	denials := []struct {
		ps  []netip.Prefix
		why string
	}{{metadata, whyLocal}, {never, whyLocal}, {k.cluster, whyCluster}, {g.named, whyCluster}, {g.denied, whyDenied}}
	if len(k.unreadable) > 0 {
		denials = append(denials, struct {
			ps  []netip.Prefix
			why string
		}{private, whyUnreadable(k.unreadable)})
	}
	for _, s := range spellings {
		allowed := longest(g.allowed, s)
		why, bits := "", -1
		if g.content {
			// An IPv6 address that spells an IPv4 one is judged by it.
			switch {
			case s.Is4():
				why, bits = whyContent, longest(nonPublic4, s)
			case len(spellings) == 1:
				why, bits = whyContent, longest(notGlobal6, s)
			}
		}
		for _, d := range denials {
			if b := longest(d.ps, s); b > bits {
				why, bits = d.why, b
			}
		}
		if bits >= 0 && allowed < bits {
			return why
		}
	}
	return ""
}

// longest returns the length of the longest prefix of ps holding a, or
// -1.
func longest(ps []netip.Prefix, a netip.Addr) int {
	best := -1
	for _, p := range ps {
		if p.Bits() > best && p.Contains(a) {
			best = p.Bits()
		}
	}
	return best
}

// refused is the error of a refused endpoint. It says what was refused
// and why in general words; never what a name resolved to (that would
// answer a tenant's question about the provider's network).
func refused(host, why string) error {
	return &proxy.Error{Class: proxy.ClassPermanent, Reason: ReasonRefused, Err: &RefusedError{Host: host, Why: why}}
}

// RefusedError is a connection the guard refused.
type RefusedError struct {
	// Host is the name or address that was refused.
	Host string
	// Why says what kind of address it is (or resolves to).
	Why string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the provider does not connect to %s for tenants: %s (the platform team can allow a range for tenants: docs/security.md)", e.Host, e.Why)
}

// IsRefused reports whether err is (or wraps) a refusal of the guard.
func IsRefused(err error) bool {
	var re *RefusedError
	return errors.As(err, &re)
}

// CheckHost resolves host (a name or an address literal) and checks every
// address it resolves to: one refused address refuses the name, as Squid
// does. It returns the addresses.
func (g *Guard) CheckHost(ctx context.Context, host string) ([]netip.Addr, error) {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, g.Check(ctx, a)
	}
	if g == nil {
		return nil, nil
	}
	if why := localName(host); why != "" {
		return nil, refused(host, why)
	}
	addrs, err := g.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, unresolved(host, err)
	}
	k, err := g.clusterNetworks(ctx)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if why := g.refuse(a, k); why != "" {
			return nil, refused(host, "it resolves to "+why)
		}
	}
	return addrs, nil
}

// clusterNetworks are the cluster's networks to refuse, and the sources
// of them that cannot be read (Partial). While they are not known yet
// (Complete), nothing can be checked against them: a Transient error,
// naming no address.
func (g *Guard) clusterNetworks(ctx context.Context) (known, error) {
	var k known
	if c, ok := g.cluster.(Complete); ok {
		nets, err := c.Complete(ctx)
		if err != nil {
			return known{}, proxy.Transientf("cannot check the address yet: %v", err)
		}
		k.cluster = nets
	} else if g.cluster != nil {
		k.cluster = g.cluster.Networks(ctx)
	}
	if p, ok := g.cluster.(Partial); ok {
		for _, s := range p.Unreadable(ctx) {
			if !g.standsIn[s] {
				k.unreadable = append(k.unreadable, s)
			}
		}
		g.warn.note(k.unreadable)
	}
	return k, nil
}

// localName refuses the names that mean the host itself in every pod's
// /etc/hosts or by RFC 6761, before any lookup.
func localName(host string) string {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	switch {
	case h == "localhost", strings.HasSuffix(h, ".localhost"),
		h == "ip6-localhost", h == "ip6-loopback", h == "localhost6", strings.HasPrefix(h, "localhost6."),
		h == "metadata.google.internal", h == "metadata":
		return "a name for the host itself or its metadata server"
	}
	return ""
}

// DialContext resolves address, checks every address it resolves to and
// connects to a checked one; the socket's own Control checks the address
// it connects to once more, so nothing between the check and the connect
// (a second resolution) can change it. A nil Guard dials plainly.
func (g *Guard) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if g == nil {
		return (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext(ctx, network, address)
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	addrs, err := g.CheckHost(ctx, host)
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{Timeout: g.timeout, KeepAlive: 30 * time.Second, Control: g.control(ctx)}
	var first error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = fmt.Errorf("%s resolves to no address", host)
	}
	return nil, withoutAddress(first, network, address)
}

// withoutAddress gives a failed dial of a name the name in place of the
// address it resolved to: what a name resolves to is the provider's
// resolver's answer, not the tenant's to learn. The error stays a
// *net.OpError of the dial for its classification.
func withoutAddress(err error, network, address string) error {
	var oe *net.OpError
	if !errors.As(err, &oe) {
		return err
	}
	c := *oe
	c.Source, c.Addr = nil, named{network: network, address: address}
	return &c
}

// named is a net.Addr that is the name a tenant wrote.
type named struct{ network, address string }

func (n named) Network() string { return n.network }
func (n named) String() string  { return n.address }

// control checks the address a socket is about to connect to.
func (g *Guard) control(ctx context.Context) func(network, address string, _ syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return refused(address, "not an address the guard can check")
		}
		return g.Check(ctx, ap.Addr())
	}
}

// Reported is g as the guard of the addresses a backend reports for a
// proxy (its readiness probe, the egress check): nil when g is, so the
// platform's configs keep the prober's own dial.
func (g *Guard) Reported() squid.Guard {
	if g == nil {
		return nil
	}
	return g
}

// CheckURL checks u's host: its scheme is http or https, and every
// address its host resolves to is allowed.
func (g *Guard) CheckURL(ctx context.Context, u *url.URL) error {
	if g == nil {
		return nil
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return refused(u.Redacted(), "not an http or https URL")
	}
	_, err := g.CheckHost(ctx, u.Hostname())
	return err
}

// CheckRedirect is an http.Client's CheckRedirect: every redirect's
// target is checked (the dial checks it again), and at most 10 are
// followed.
// A refusal names the URL the tenant wrote, not the target: where a
// redirect leads is what the endpoint answered.
func (g *Guard) CheckRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	err := g.CheckURL(req.Context(), req.URL)
	if err == nil || len(via) == 0 {
		return err
	}
	from := "a redirect from " + via[0].URL.Host
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return refused(from, "its target is not an http or https URL")
	}
	var re *RefusedError
	if errors.As(err, &re) {
		// The kind of address, without the address or name.
		what := re.Why
		if i := strings.Index(what, " is "); i >= 0 && !strings.HasPrefix(what, "it resolves to ") {
			what = what[i+len(" is "):]
		}
		return refused(from, "its target is "+strings.TrimPrefix(what, "it resolves to "))
	}
	return proxy.Transientf("cannot check the target of %s", from)
}

// DialFunc is a transport's dial.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// ProxyFunc is a transport's proxy choice (http.ProxyFromEnvironment).
type ProxyFunc func(*http.Request) (*url.URL, error)

// Transport returns base (cloned) dialling through g, with the proxy of
// the environment (HTTPS_PROXY, NO_PROXY) unless base names another (Via).
// A nil base is http.DefaultTransport; a nil Guard returns base with the
// environment's proxy.
func (g *Guard) Transport(base *http.Transport) *http.Transport {
	if base == nil {
		base, _ = http.DefaultTransport.(*http.Transport)
	}
	if base == nil {
		base = &http.Transport{}
	}
	t := base.Clone()
	if t.Proxy == nil {
		t.Proxy = http.ProxyFromEnvironment
	}
	if g == nil {
		return t
	}
	t.Proxy, t.DialContext = g.Via(t.Proxy, t.DialContext)
	return t
}

// Via returns a transport's proxy and dial functions for proxy (the
// platform team's choice) and plain (nil: a net.Dialer) through g. A
// request handed to a proxy has its target checked first; the proxy then
// connects, and resolves the name again itself, so what the proxy lets
// through is the proxy's to decide. The proxy is dialled with plain.
// Every other connection is g's.
func (g *Guard) Via(proxy ProxyFunc, plain DialFunc) (ProxyFunc, DialFunc) {
	if plain == nil {
		plain = (&net.Dialer{Timeout: g.timeout, KeepAlive: 30 * time.Second}).DialContext
	}
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	// The proxies requests were handed to. A request sent directly to one
	// of their addresses (NO_PROXY) is checked here, before its dial.
	var proxies sync.Map
	choose := func(req *http.Request) (*url.URL, error) {
		p, err := proxy(req)
		if err != nil {
			return nil, err
		}
		if p != nil {
			proxies.Store(hostPort(p), true)
		} else if _, ok := proxies.Load(hostPort(req.URL)); !ok {
			return nil, nil
		}
		if err := g.CheckURL(req.Context(), req.URL); err != nil {
			return nil, err
		}
		return p, nil
	}
	dial := func(ctx context.Context, network, address string) (net.Conn, error) {
		if _, ok := proxies.Load(address); ok {
			return plain(ctx, network, address)
		}
		return g.DialContext(ctx, network, address)
	}
	return choose, dial
}

// hostPort is the address a transport dials for u: its host and port,
// the scheme's default port when it has none.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "https":
			port = "443"
		case "socks5", "socks5h":
			port = "1080"
		default:
			port = "80"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// version is a version as servers write it, optionally after a name and
// a slash, and followed by anything: v1.31.0, 8.2.4,
// pve-manager/8.2.4/faa83925, 6.8.12-4-pve, v1.31.0-gke.1234.
var version = regexp.MustCompile(`^(?:[a-z][a-z0-9-]{0,31}/)?v?([0-9]{1,6}(?:\.[0-9]{1,9}){0,3})(?:[-+~./_][!-~]*)?$`)

// Version returns the numbers of a version string a tenant's endpoint
// answered (8.2.4 of pve-manager/8.2.4/faa83925, 1.31.0 of
// v1.31.0-gke.1234), "" when it is not shaped as one: what a tenant's
// endpoint says is shown as numbers, never in its own words.
func Version(s string) string {
	if m := version.FindStringSubmatch(s); m != nil {
		return m[1]
	}
	return ""
}

// Quiet returns err when it carries nothing an endpoint said (a refusal,
// a failed dial or lookup, a timeout), and otherwise an error saying only
// that field's endpoint answered, which unwraps to err for classification:
// net/http quotes the first bytes of a response it cannot read (an SSH
// banner, a service that is not HTTP), TLS errors a certificate's names.
// What a tenant's endpoint answers is never quoted back to the tenant.
//
// Either comes without the URL net/http names around it: after a
// redirect, that is the target the endpoint chose (a client that follows
// a tenant's redirects uses AfterRedirect for what failed after one).
func Quiet(err error, field string) error {
	if err == nil {
		return nil
	}
	var oe *net.OpError
	var de *net.DNSError
	var ue *UnresolvedError
	if errors.As(err, &de) && !errors.As(err, &ue) {
		return unresolved(de.Name, err)
	}
	if IsRefused(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &oe) && oe.Op == "dial") || de != nil {
		return WithoutURL(err)
	}
	return &quietError{err: err, field: field}
}

// UnresolvedError is a failed lookup of a name, in words that do not name
// the provider's DNS server (a *net.DNSError names it: in a pod, the
// cluster DNS Service's address). It unwraps to the lookup's error, so
// errors.As still finds the *net.DNSError and its IsNotFound and IsTimeout.
type UnresolvedError struct {
	Host string
	Err  error
}

// unresolved is err, the failure of host's lookup, as an UnresolvedError.
func unresolved(host string, err error) error {
	return &UnresolvedError{Host: host, Err: err}
}

func (e *UnresolvedError) Error() string {
	msg := "cannot resolve " + e.Host
	var de *net.DNSError
	switch {
	case errors.As(e.Err, &de) && de.IsNotFound:
		return msg + ": no such host"
	case errors.As(e.Err, &de) && de.IsTimeout, errors.Is(e.Err, context.DeadlineExceeded):
		return msg + ": the lookup timed out"
	case errors.Is(e.Err, context.Canceled):
		return msg + ": the lookup was cancelled"
	}
	return msg + ": the lookup failed"
}

func (e *UnresolvedError) Unwrap() error { return e.Err }

// NoRedirects is an http.Client's CheckRedirect for a tenant's API
// endpoint, which has no reason to redirect: none is followed, so nothing
// connects to where it led and no error names it.
func (g *Guard) NoRedirects(_ *http.Request, via []*http.Request) error {
	return refused("a redirect from "+via[0].URL.Host, "an API endpoint's redirects are not followed")
}

// AfterRedirect is err, the failure of a request that a tenant's endpoint
// redirected, without a word of where the redirect led (a dial error
// names its host): only that the request failed after a redirect from
// origin, unwrapping to err for classification. A refusal passes as
// Quiet passes it.
func AfterRedirect(err error, origin string) error {
	if err == nil || IsRefused(err) {
		return Quiet(err, "")
	}
	return &quietError{err: err, field: "a redirect from " + origin, what: "failed after the redirect; where it led is not shown to tenants"}
}

// WithoutURL is err without the URL net/http names in its errors (the
// *url.Error in its chain: the request's, or a redirect's target, whose
// query or user info may be credentials), its chain kept for errors.As.
func WithoutURL(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	return &urlFreeError{err: err, named: fmt.Sprintf("%s %q: ", ue.Op, ue.URL)}
}

type urlFreeError struct {
	err   error
	named string
}

func (e *urlFreeError) Error() string { return strings.Replace(e.err.Error(), e.named, "", 1) }

func (e *urlFreeError) Unwrap() error { return e.err }

type quietError struct {
	err   error
	field string
	// what replaces the default words after the field.
	what string
}

func (e *quietError) Error() string {
	if e.what != "" {
		return "the connection to " + e.field + " " + e.what
	}
	return "the connection to " + e.field + " failed after it answered; what it answered is not shown to tenants"
}

func (e *quietError) Unwrap() error { return e.err }
