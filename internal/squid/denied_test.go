package squid

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// dstACLs are the dst ACLs of a squid.conf, each the values of all its
// lines.
func dstACLs(t *testing.T, conf string) map[string][]netip.Prefix {
	t.Helper()
	acls := map[string][]netip.Prefix{}
	for _, l := range lines(conf, "acl ") {
		f := strings.Fields(l)
		if len(f) < 4 || f[2] != "dst" || strings.HasPrefix(f[3], `"`) {
			continue
		}
		for _, v := range f[3:] {
			acls[f[1]] = append(acls[f[1]], netip.MustParsePrefix(v))
		}
	}
	return acls
}

// deniedByDst says whether one of the conf's deny rules made of dst ACLs
// alone refuses a name resolving to addrs, as Squid matches them: a dst
// ACL matches when any of the name's addresses is in it.
func deniedByDst(t *testing.T, conf string, addrs []netip.Addr) bool {
	t.Helper()
	acls := dstACLs(t, conf)
	anyIn := func(ps []netip.Prefix) bool {
		return slices.ContainsFunc(addrs, func(a netip.Addr) bool {
			return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
		})
	}
rules:
	for _, r := range lines(conf, "http_access deny ") {
		for _, term := range strings.Fields(r)[2:] {
			name, negated := strings.CutPrefix(term, "!")
			ps, ok := acls[name]
			if !ok || anyIn(ps) == negated {
				continue rules // not a dst rule, or a term that does not hold
			}
		}
		return true
	}
	return false
}

func TestRenderDeniesEveryUnopenedAddressOfAName(t *testing.T) {
	s := validSettings()
	s.AllowedDestinationCIDRs = []string{"10.30.4.0/24", "fd12:3456::7/128"}
	f, err := Render(s, Options{DeniedDestinationCIDRs: []string{"10.96.0.0/12"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		addrs  []string
		denied bool
	}{
		"opened":                               {[]string{"10.30.4.9"}, false},
		"opened twice":                         {[]string{"10.30.4.9", "10.30.4.200"}, false},
		"opened IPv4 and IPv6":                 {[]string{"10.30.4.9", "fd12:3456::7"}, false},
		"public and opened":                    {[]string{"93.184.216.34", "10.30.4.9"}, false},
		"public":                               {[]string{"93.184.216.34", "2001:db8::1"}, false},
		"opened and unopened private":          {[]string{"10.30.4.9", "192.168.1.10"}, true},
		"opened and its neighbour":             {[]string{"10.30.4.9", "10.30.5.1"}, true},
		"opened and unopened ULA":              {[]string{"10.30.4.9", "fd99::1"}, true},
		"opened ULA and the next address":      {[]string{"fd12:3456::7", "fd12:3456::8"}, true},
		"opened and unopened NAT64":            {[]string{"10.30.4.9", "64:ff9b::ac10:1"}, true},
		"opened and unopened 6to4":             {[]string{"10.30.4.9", "2002:c0a8:10a::1"}, true},
		"opened and the backend's network":     {[]string{"10.30.4.9", "10.96.0.1"}, true},
		"opened and metadata":                  {[]string{"10.30.4.9", "169.254.169.254"}, true},
		"opened and metadata, local-use NAT64": {[]string{"10.30.4.9", "64:ff9b:1:a9fe:a9fe::"}, true},
		"unopened private":                     {[]string{"172.16.0.1"}, true},
	} {
		t.Run(name, func(t *testing.T) {
			var addrs []netip.Addr
			for _, a := range tc.addrs {
				addrs = append(addrs, netip.MustParseAddr(a))
			}
			if got := deniedByDst(t, f.SquidConf, addrs); got != tc.denied {
				t.Errorf("a name resolving to %v: denied %v, want %v\n%s", tc.addrs, got, tc.denied, strings.Join(lines(f.SquidConf, "acl "), "\n"))
			}
		})
	}
}

func TestSubtract(t *testing.T) {
	ps := prefixes("10.0.0.0/8", "192.168.0.0/16", "fc00::/7", "64:ff9b::a00:0/104")
	for name, tc := range map[string]struct {
		holes []netip.Prefix
		want  int // prefixes: the fewest that hold the rest
	}{
		"no holes":                  {nil, 4},
		"a whole range":             {prefixes("192.168.0.0/16"), 3},
		"more than a range":         {prefixes("192.0.0.0/8"), 3},
		"a /24 in a /8":             {prefixes("10.30.4.0/24"), 4 - 1 + 24 - 8},
		"one IPv6 address":          {prefixes("fd12:3456::7/128"), 4 - 1 + 128 - 7},
		"two holes in one range":    {prefixes("10.0.0.0/24", "10.0.1.0/24"), 4 - 1 + 23 - 8},
		"a hole in another family":  {prefixes("::ffff:10.0.0.0/104", "2001:db8::/32"), 4},
		"a NAT64 spelling":          {prefixes("64:ff9b::a1e:400/120"), 4 - 1 + 120 - 104},
		"nested holes":              {prefixes("10.30.0.0/16", "10.30.4.0/24"), 4 - 1 + 16 - 8},
		"holes in different ranges": {prefixes("10.30.4.0/24", "fd00::/8"), 4 - 2 + 24 - 8 + 8 - 7},
	} {
		t.Run(name, func(t *testing.T) {
			got := subtract(ps, tc.holes)
			if len(got) != tc.want {
				t.Errorf("subtract() = %d prefixes, want %d: %v", len(got), tc.want, got)
			}
			for i, p := range got {
				for _, q := range got[i+1:] {
					if p.Overlaps(q) {
						t.Errorf("subtract() holds %s and %s, which overlap", p, q)
					}
				}
			}
			in := func(a netip.Addr, ps []netip.Prefix) bool {
				return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
			}
			// Addresses at and around every edge, and at random.
			var probes []netip.Addr
			for _, p := range slices.Concat(ps, tc.holes, got) {
				a := p.Masked().Addr()
				last := lastAddr(p)
				probes = append(probes, a, a.Prev(), last, last.Next())
				for range 50 {
					probes = append(probes, randomIn(p))
				}
			}
			for _, a := range probes {
				if !a.IsValid() {
					continue
				}
				if want := in(a, ps) && !in(a, tc.holes); in(a, got) != want {
					t.Errorf("%s in subtract() = %v, want %v", a, !want, want)
				}
			}
		})
	}
}

// lastAddr is the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// randomIn is a random address of p.
func randomIn(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		if rand.IntN(2) == 1 { //nolint:gosec // test probes.
			b[i/8] |= 0x80 >> (i % 8)
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Opening single addresses splits the private ranges into many prefixes:
// the ACL is written over lines that Squid reads whole.
func TestRenderKeepsACLLinesShort(t *testing.T) {
	s := validSettings()
	s.AllowedDestinationCIDRs = []string{"fdff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/128", "fc00::1/128", "10.255.255.254/32", "64:ff9b::c0a8:ffff/128", "2002:ac1f:ffff::/48"}
	f, err := Render(s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(f.SquidConf, "\n") {
		if len(l) > maxLine {
			t.Errorf("a line of %d bytes, over %d: %.80s…", len(l), maxLine, l)
		}
	}
	if n := len(lines(f.SquidConf, "acl private_dst dst ")); n < 2 {
		t.Errorf("private_dst on %d lines, want it split", n)
	}
	for _, a := range []string{"fdff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "fc00::1", "10.255.255.254", "64:ff9b::c0a8:ffff", "2002:ac1f:ffff::1"} {
		if deniedByDst(t, f.SquidConf, []netip.Addr{netip.MustParseAddr(a)}) {
			t.Errorf("%s is opened but denied", a)
		}
	}
	for _, a := range []string{"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fc00::", "10.255.255.255", "64:ff9b::c0a8:fffe", "2002:ac1f:fffe::1"} {
		if !deniedByDst(t, f.SquidConf, []netip.Addr{netip.MustParseAddr(a)}) {
			t.Errorf("%s is next to an opened address but not denied", a)
		}
	}
}

// Local-use NAT64 spells IPv4 where each network chooses, so it cannot be
// opened without opening every never range in it.
func TestLocalUseNAT64IsNeverOpened(t *testing.T) {
	never, private := Denied(nil)
	p := netip.MustParsePrefix("64:ff9b:1::/48")
	if !slices.Contains(never, p) || slices.Contains(private, p) {
		t.Errorf("Denied() = never %v, private %v; want %s among never", never, private, p)
	}
	for _, c := range []string{"64:ff9b:1::/48", "64:ff9b:1::a1e:400/120", "64:ff9b:1:a1e:400::/56"} {
		s := validSettings()
		s.AllowedDestinationCIDRs = []string{c}
		if err := Validate(s); err == nil || !strings.Contains(err.Error(), "local-use NAT64 (64:ff9b:1::/48) never") {
			t.Errorf("Validate(allowedDestinationCIDRs: %s) = %v, want it refused as never opened", c, err)
		}
	}
	f, err := Render(validSettings(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(dstACLs(t, f.SquidConf)["never_dst"], p) {
		t.Errorf("never_dst lacks %s:\n%s", p, strings.Join(lines(f.SquidConf, "acl never_dst"), "\n"))
	}
}
