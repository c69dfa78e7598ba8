package squid

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// A proxy is not a way into the network it stands in. Squid checks these
// ranges against the addresses a destination resolves to (dst ACLs), so a
// name that resolves into one is refused like the address itself.

// NeverDestinations are denied on every proxy and cannot be opened by
// proxy.Settings.AllowedDestinationCIDRs: the proxy host itself (loopback,
// "this network", which reaches the host), link-local (where metadata
// servers and link-local services live), every cloud's metadata addresses
// (some outside link-local), multicast, reserved and broadcast space.
var NeverDestinations = prefixes(
	"0.0.0.0/8",          // "this network": 0.0.0.0 reaches the host itself
	"127.0.0.0/8",        // loopback
	"169.254.0.0/16",     // link-local; 169.254.169.254 is AWS, GCP, Azure, OpenStack... metadata
	"100.100.100.200/32", // Alibaba Cloud metadata (inside 100.64.0.0/10)
	"168.63.129.16/32",   // Azure WireServer (public space)
	"192.0.0.192/32",     // Oracle Cloud metadata (inside 192.0.0.0/24)
	"224.0.0.0/3",        // multicast, reserved, broadcast
	"::/96",              // unspecified, loopback and the IPv4-compatible addresses
	"fe80::/10",          // link-local
	"fec0::/10",          // site-local (deprecated, still routed by some)
	"ff00::/8",           // multicast
	"fd00:ec2::254/128",  // AWS metadata over IPv6
	"fd00:ec2::23/128",   // AWS DNS over IPv6
	"fd20:ce::254/128",   // GCP metadata over IPv6
)

// PrivateDestinations are denied unless AllowedDestinationCIDRs opens
// them: private and shared address space, where the networks behind a
// proxy live.
var PrivateDestinations = prefixes(
	"10.0.0.0/8",     // RFC 1918
	"172.16.0.0/12",  // RFC 1918
	"192.168.0.0/16", // RFC 1918
	"100.64.0.0/10",  // carrier-grade NAT, shared address space (RFC 6598)
	"192.0.0.0/24",   // IETF protocol assignments
	"fc00::/7",       // unique local addresses
	"64:ff9b:1::/48", // local-use NAT64 (RFC 8215): embeds IPv4 anywhere
)

// Denied returns the ranges a proxy denies, exactly as Squid checks them
// (each IPv4 range also in its NAT64 and 6to4 spellings): never are denied
// always (NeverDestinations and extra, Options.DeniedDestinationCIDRs),
// private unless AllowedDestinationCIDRs opens them. A backend that
// enforces the same below Squid (a NetworkPolicy) uses these, so the two
// fences cannot drift apart. Entries of extra that do not parse are left
// out (Render refuses them).
func Denied(extra []string) (never, private []netip.Prefix) {
	never = slices.Clone(NeverDestinations)
	for _, d := range extra {
		if p, err := parseCIDROrAddr(d); err == nil {
			never = append(never, p)
		}
	}
	return withEmbeddings(never), withEmbeddings(PrivateDestinations)
}

// prefixes parses a fixed list.
func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

// IPv6 prefixes that embed an IPv4 address right after them, through which
// an IPv4 destination is reached by an IPv6 name: NAT64's well-known prefix
// (RFC 6052) and 6to4 (RFC 3056).
var embeddings = []netip.Prefix{
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("2002::/16"),
}

// withEmbeddings returns ps and, for every IPv4 prefix, the same range as
// each IPv4-embedding IPv6 prefix spells it, so 64:ff9b::7f00:1 (NAT64 for
// 127.0.0.1) is as denied as 127.0.0.1. (IPv4-mapped ::ffff:a.b.c.d needs
// nothing: Squid stores every IPv4 address that way.)
func withEmbeddings(ps []netip.Prefix) []netip.Prefix {
	out := slices.Clone(ps)
	for _, p := range ps {
		if !p.Addr().Is4() {
			continue
		}
		v4 := p.Addr().As4()
		for _, e := range embeddings {
			b := e.Addr().As16()
			copy(b[e.Bits()/8:], v4[:])
			out = append(out, netip.PrefixFrom(netip.AddrFrom16(b), e.Bits()+p.Bits()))
		}
	}
	return out
}

// normalize masks p and writes an IPv4-mapped prefix as IPv4, as Squid
// sees it.
func normalize(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= v4Mapped.Bits() {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-v4Mapped.Bits())
	}
	return p
}

// parseCIDROrAddr parses a CIDR, or a bare address as its /32 or /128.
func parseCIDROrAddr(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return normalize(p), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR", s)
	}
	return normalize(netip.PrefixFrom(a, a.BitLen())), nil
}

// compact sorts ps, IPv4 first, and drops duplicates and prefixes inside
// another of their family (Squid warns about those and drops them itself).
func compact(ps []netip.Prefix) []string {
	return compactBy(ps, func(q, p netip.Prefix) bool {
		return q.Addr().Is4() == p.Addr().Is4() && q.Bits() < p.Bits() && q.Contains(p.Addr())
	})
}

// compactBy sorts ps, IPv4 first, then IPv6 (netip orders by family), for
// a readable conf, and drops duplicates and each prefix p that another, q,
// covers.
func compactBy(ps []netip.Prefix, covers func(q, p netip.Prefix) bool) []string {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	ps = slices.Compact(ps)
	var out []string
	for _, p := range ps {
		// ps holds no duplicates now: q != p is "another".
		if !slices.ContainsFunc(ps, func(q netip.Prefix) bool { return q != p && covers(q, p) }) {
			out = append(out, p.String())
		}
	}
	return out
}

// checkDestinationCIDR returns what is wrong with one entry of
// AllowedDestinationCIDRs, or "". Only the private ranges can be opened:
// public ones are not denied, and what NeverDestinations holds never is
// (a metadata address inside an opened range, 100.100.100.200 in
// 100.64.0.0/10 say, stays denied).
func checkDestinationCIDR(c string) string {
	p, err := netip.ParsePrefix(c)
	if err != nil {
		return fmt.Sprintf("%q is not a CIDR (want e.g. 10.20.0.0/16; for one address write /32 or /128)", c)
	}
	p = normalize(p)
	for _, q := range withEmbeddings(PrivateDestinations) {
		if q.Addr().Is4() == p.Addr().Is4() && q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
			return ""
		}
	}
	return fmt.Sprintf("%q is not inside a private range (%s); only those are denied and can be opened: the proxy host, link-local and metadata addresses never are, and public addresses need no opening", c, strings.Join(compact(PrivateDestinations), ", "))
}

// destinationACLs are the dst ACL lines and the deny rules for Render.
func destinationACLs(s proxy.Settings, o Options) (acls, rules []string) {
	never, private := Denied(o.DeniedDestinationCIDRs) // withDefaults checked them.
	acls = append(acls,
		"# Destinations never reached, checked after name resolution: the proxy",
		"# host, link-local, cloud metadata services, multicast and reserved",
		"# space, and what the backend adds (a cluster's own networks).",
		"acl never_dst dst "+strings.Join(compact(never), " "),
		"# Private ranges: reached only where allowedDestinationCIDRs opens them.",
		"acl private_dst dst "+strings.Join(compact(private), " "))
	rules = append(rules,
		"# Never: the proxy's own host, link-local and metadata (which hand out",
		"# the machine's credentials), the backend's own networks.",
		"http_access deny never_dst")
	var opened []netip.Prefix
	for _, c := range s.AllowedDestinationCIDRs {
		opened = append(opened, normalize(netip.MustParsePrefix(c))) // Validate checked it.
	}
	if len(opened) > 0 {
		acls = append(acls, "acl opened_dst dst "+strings.Join(compact(opened), " "))
		rules = append(rules, "http_access deny private_dst !opened_dst")
	} else {
		rules = append(rules, "http_access deny private_dst")
	}
	return acls, rules
}
