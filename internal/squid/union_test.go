package squid

import (
	"fmt"
	"math/big"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func TestClientUnion(t *testing.T) {
	pow := func(n uint) string { return new(big.Int).Lsh(big.NewInt(1), n).String() }
	sixtyFourSlash8 := make([]string, 64)
	for i := range sixtyFourSlash8 {
		sixtyFourSlash8[i] = fmt.Sprintf("%d.0.0.0/8", i+1)
	}
	for name, tc := range map[string]struct {
		cidrs  []string
		v4, v6 string
	}{
		"one /8":                 {[]string{"10.0.0.0/8"}, pow(24), "0"},
		"sixty-four /8s":         {sixtyFourSlash8, pow(30), "0"},
		"overlapping entries":    {[]string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.3/32", "10.0.0.0/8"}, pow(24), "0"},
		"unmasked duplicates":    {[]string{"10.1.2.3/8", "10.0.0.0/8"}, pow(24), "0"},
		"two halves of a /8":     {[]string{"10.0.0.0/9", "10.128.0.0/9"}, pow(24), "0"},
		"adjacent /9s over two":  {[]string{"10.128.0.0/9", "11.0.0.0/9"}, pow(24), "0"},
		"IPv4-mapped is IPv4":    {[]string{"::ffff:10.0.0.0/104", "10.0.0.0/8", "::ffff:11.0.0.0/104"}, pow(25), "0"},
		"NAT64 carries IPv4":     {[]string{"64:ff9b::a00:0/104", "10.0.0.0/8"}, pow(24), pow(24)},
		"NAT64 /96 is all IPv4":  {[]string{"64:ff9b::/96"}, pow(32), pow(32)},
		"covering NAT64":         {[]string{"64:ff9b::/64"}, pow(32), pow(64)},
		"6to4 carries IPv4":      {[]string{"2002:a00::/24"}, pow(24), pow(104)},
		"6to4 inside one IPv4":   {[]string{"2002:a00:1::/48", "2002:a00:1:1::/64"}, "1", pow(80)},
		"covering mapped":        {[]string{"::/64"}, pow(32), pow(64)},
		"IPv6 entries":           {[]string{"2001:db8::/33", "2001:db8:8000::/33", "2001:db8::1/128"}, "0", pow(96)},
		"both families":          {[]string{"2001:db8::/32", "192.0.2.0/24"}, pow(8), pow(96)},
		"garbage is left out":    {[]string{"any", "10.0.0.0/8"}, pow(24), "0"},
		"nested IPv6":            {[]string{"2001:db8::/48", "2001:db8::/32"}, "0", pow(96)},
		"disjoint IPv6 over /32": {[]string{"2001:db8::/32", "2001:db9::/32"}, "0", pow(97)},
	} {
		t.Run(name, func(t *testing.T) {
			v4, v6 := ClientUnion(tc.cidrs)
			if v4.String() != tc.v4 || v6.String() != tc.v6 {
				t.Errorf("ClientUnion(%v) = %s IPv4, %s IPv6; want %s, %s", tc.cidrs, v4, v6, tc.v4, tc.v6)
			}
		})
	}
}

// Without auth, the /8 and /32 limits hold for the entries together, however
// they are split, overlapped or spelt; with auth, anything goes.
func TestValidateClientUnion(t *testing.T) {
	sixtyFourSlash8 := make([]string, 64)
	for i := range sixtyFourSlash8 {
		sixtyFourSlash8[i] = fmt.Sprintf("%d.0.0.0/8", i+1)
	}
	refused := map[string][]string{
		"sixty-four /8s":               sixtyFourSlash8,
		"two /8s":                      {"10.0.0.0/8", "11.0.0.0/8"},
		"a /8 and one more address":    {"10.0.0.0/8", "192.0.2.1/32"},
		"a /8 and its NAT64 neighbour": {"10.0.0.0/8", "64:ff9b::b00:0/104"},
		"NAT64 of all IPv4":            {"64:ff9b::/96"},
		"a /8 and 6to4 outside it":     {"10.0.0.0/8", "2002:b00::/32"},
		"two IPv6 /32s":                {"2001:db8::/32", "2001:db9::/32"},
		"mapped next to IPv4":          {"::ffff:10.0.0.0/104", "11.0.0.0/8"},
	}
	for name, cidrs := range refused {
		t.Run("refuses "+name, func(t *testing.T) {
			s := validSettings()
			s.AllowedClientCIDRs = cidrs
			err := Validate(s)
			if err == nil {
				t.Fatalf("Validate(%v) = nil, want a refusal of allowedClientCIDRs together", cidrs)
			}
			if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "allowedClientCIDRs: together admit") || !strings.Contains(err.Error(), "auth.enabled: true") {
				t.Errorf("Validate(%v) = %v, want a permanent error naming allowedClientCIDRs, the limit and auth", cidrs, err)
			}
			s.Auth = proxy.Auth{Enabled: true, Username: "a", Password: "a-long-enough-password"}
			if err := Validate(s); err != nil {
				t.Errorf("with auth: Validate(%v) = %v, want nil", cidrs, err)
			}
		})
	}
	accepted := map[string][]string{
		"a /8 split and overlapped": {"10.0.0.0/9", "10.128.0.0/9", "10.1.0.0/16", "::ffff:10.2.0.0/112"},
		"a /8 and its NAT64 twin":   {"10.0.0.0/8", "64:ff9b::a00:0/104"},
		"a /8 and a /32":            {"10.0.0.0/8", "2001:db8::/32"},
		"many small ones":           {"192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/48", "2001:db8:1::/48"},
	}
	for name, cidrs := range accepted {
		t.Run("accepts "+name, func(t *testing.T) {
			s := validSettings()
			s.AllowedClientCIDRs = cidrs
			if err := Validate(s); err != nil {
				t.Errorf("Validate(%v) = %v, want nil", cidrs, err)
			}
		})
	}
}
