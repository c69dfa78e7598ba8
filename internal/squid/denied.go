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
	"64:ff9b:1::/48",     // local-use NAT64 (RFC 8215): embeds IPv4 where each network chooses, so no never range can be spelled in it
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
	return fmt.Sprintf("%q is not inside a private range (%s); only those are denied and can be opened: the proxy host, link-local and metadata addresses and local-use NAT64 (64:ff9b:1::/48) never are, and public addresses need no opening", c, strings.Join(compact(PrivateDestinations), ", "))
}

// destinationACLs are the dst ACL lines and the deny rules for Render.
func destinationACLs(s proxy.Settings, o Options) (acls, rules []string) {
	never, private := Denied(o.DeniedDestinationCIDRs) // withDefaults checked them.
	var opened []netip.Prefix
	for _, c := range s.AllowedDestinationCIDRs {
		opened = append(opened, normalize(netip.MustParsePrefix(c))) // Validate checked it.
	}
	acls = append(acls,
		"# Destinations never reached, checked after name resolution: the proxy",
		"# host, link-local, cloud metadata services, multicast and reserved",
		"# space, and what the backend adds (a cluster's own networks).")
	acls = append(acls, aclLines("never_dst", "dst", compact(never))...)
	rules = append(rules,
		"# Never: the proxy's own host, link-local and metadata (which hand out",
		"# the machine's credentials), the backend's own networks.",
		"http_access deny never_dst")
	// A dst ACL matches a name when any of its addresses is listed, and
	// Squid may connect to any of them. So the opened ranges are cut out of
	// the private ones rather than excepted in the rule: "deny private_dst
	// !opened_dst" would pass a name resolving to an opened and an unopened
	// address, and the unopened one could be reached.
	if denied := compact(subtract(private, opened)); len(denied) > 0 {
		acls = append(acls, "# Private ranges, less what allowedDestinationCIDRs opens.")
		acls = append(acls, aclLines("private_dst", "dst", denied)...)
		rules = append(rules, "http_access deny private_dst")
	}
	if len(opened) > 0 {
		acls = append(acls, "# What allowedDestinationCIDRs opens, for the reader: in no rule (see above).")
		acls = append(acls, aclLines("opened_dst", "dst", compact(opened))...)
	}
	return acls, rules
}

// subtract returns the addresses of ps outside every hole, as the fewest
// prefixes that hold them: each of ps that no hole touches, and around a
// hole the halves beside it, down to the hole.
func subtract(ps, holes []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	var cut func(p netip.Prefix)
	cut = func(p netip.Prefix) {
		split := false
		for _, h := range holes {
			if h.Addr().Is4() != p.Addr().Is4() || !h.Overlaps(p) {
				continue
			}
			if h.Bits() <= p.Bits() {
				return // the hole holds all of p
			}
			split = true
		}
		if !split {
			out = append(out, p)
			return
		}
		lo, hi := halves(p)
		cut(lo)
		cut(hi)
	}
	for _, p := range ps {
		cut(p.Masked())
	}
	return out
}

// halves splits a masked prefix shorter than its address into its two
// halves.
func halves(p netip.Prefix) (lo, hi netip.Prefix) {
	b := p.Addr().AsSlice()
	b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(p.Addr(), p.Bits()+1), netip.PrefixFrom(a, p.Bits()+1)
}

// maxLine keeps a squid.conf line whole as Squid reads it: with fgets of
// BUFSIZ bytes, 8192 under glibc but 1024 under musl (an Alpine guest's or
// image's Squid), the rest of a longer line being read as a directive of
// its own.
const maxLine = 1000

// aclLines writes the ACL name of type typ (with its flags, such as
// "dstdomain -n") over as many lines as its values need to keep each
// within maxLine; Squid adds up the lines of one ACL. A value list on one
// line could otherwise run past Squid's line buffer, whose rest Squid
// reads as a directive of its own.
func aclLines(name, typ string, values []string) []string {
	head := "acl " + name + " " + typ
	var out []string
	line := head
	for _, v := range values {
		if line != head && len(line)+1+len(v) > maxLine {
			out = append(out, line)
			line = head
		}
		line += " " + v
	}
	return append(out, line)
}
