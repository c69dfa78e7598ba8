package squid

import (
	"fmt"
	"math/big"
	"net/netip"
)

// Without auth the clients' limit applies to all of allowedClientCIDRs
// together: sixty-four /8s, each within the limit, would open a quarter of
// the IPv4 internet. The limits are the per-entry ones, as a number of
// addresses: a /8 of IPv4, a /32 of IPv6.
var (
	maxOpenV4 = new(big.Int).Lsh(big.NewInt(1), 32-MinOpenPrefixV4)
	maxOpenV6 = new(big.Int).Lsh(big.NewInt(1), 128-MinOpenPrefixV6)
)

// clientEmbeddings are the IPv6 prefixes through which IPv4 clients arrive
// with an IPv6 source address, each with the bit where the IPv4 address
// starts: IPv4-mapped (a dual-stack socket), NAT64's well-known prefix
// (SIIT-DC puts the whole IPv4 internet there) and 6to4 (a relay's
// packets come from 2002:V4ADDR::/48).
var clientEmbeddings = []struct {
	prefix netip.Prefix
	at     int
}{
	{v4Mapped, 96},
	{netip.MustParsePrefix("64:ff9b::/96"), 96},
	{netip.MustParsePrefix("2002::/16"), 16},
}

// ClientUnion is how many clients a list of client CIDRs admits, exactly:
// the IPv4 addresses (IPv4 entries and the IPv4 clients that IPv6 entries
// reach through clientEmbeddings) and the IPv6 addresses, each counted
// once however the entries overlap or are spelt. Entries that do not parse
// are left out (Validate reports them).
func ClientUnion(cidrs []string) (v4, v6 *big.Int) {
	var ps4, ps6 []netip.Prefix
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			continue
		}
		p = normalize(p)
		if p.Addr().Is4() {
			ps4 = append(ps4, p)
			continue
		}
		ps6 = append(ps6, p)
		for _, e := range clientEmbeddings {
			if q, ok := embedded(p, e.prefix, e.at); ok {
				ps4 = append(ps4, q)
			}
		}
	}
	return unionSize(ps4, 32), unionSize(ps6, 128)
}

// embedded is the IPv4 prefix of the clients p admits through the IPv6
// prefix e whose IPv4 address starts at bit at, and whether p admits any.
func embedded(p, e netip.Prefix, at int) (netip.Prefix, bool) {
	switch {
	case p.Bits() <= e.Bits() && p.Contains(e.Addr()):
		// p covers all of e: every IPv4 client.
		return netip.MustParsePrefix("0.0.0.0/0"), true
	case p.Bits() > e.Bits() && e.Contains(p.Addr()):
		b := p.Addr().As16()
		var v4 [4]byte
		copy(v4[:], b[at/8:at/8+4])
		return netip.PrefixFrom(netip.AddrFrom4(v4), min(p.Bits()-at, 32)).Masked(), true
	}
	return netip.Prefix{}, false
}

// unionSize is the number of addresses in the union of ps, all of one
// family of bits-bit addresses. Two prefixes either nest or are disjoint,
// so the union is the sum of the prefixes no other one covers.
func unionSize(ps []netip.Prefix, bits int) *big.Int {
	n := new(big.Int)
	for i, p := range ps {
		covered := false
		for j, q := range ps {
			if j != i && q.Bits() <= p.Bits() && q.Contains(p.Addr()) && (q.Bits() < p.Bits() || j < i) {
				covered = true
				break
			}
		}
		if !covered {
			n.Add(n, new(big.Int).Lsh(big.NewInt(1), uint(bits-p.Bits()))) //nolint:gosec // 0 <= bits-p.Bits() <= 128.
		}
	}
	return n
}

// checkOpenUnion returns why the client CIDRs together need auth, or "".
func checkOpenUnion(cidrs []string) string {
	v4, v6 := ClientUnion(cidrs)
	switch {
	case v4.Cmp(maxOpenV4) > 0:
		return fmt.Sprintf("together admit %s IPv4 clients (counting IPv6 CIDRs that carry IPv4 clients: IPv4-mapped, NAT64 64:ff9b::/96, 6to4 2002::/16), more than a /%d (%s); without auth the entries together may cover at most a /%d of IPv4 and a /%d of IPv6: narrow them, or turn on auth (auth.enabled: true)", v4, MinOpenPrefixV4, maxOpenV4, MinOpenPrefixV4, MinOpenPrefixV6)
	case v6.Cmp(maxOpenV6) > 0:
		return fmt.Sprintf("together admit %s IPv6 clients, more than a /%d (%s); without auth the entries together may cover at most a /%d of IPv4 and a /%d of IPv6: narrow them, or turn on auth (auth.enabled: true)", v6, MinOpenPrefixV6, maxOpenV6, MinOpenPrefixV4, MinOpenPrefixV6)
	}
	return ""
}
