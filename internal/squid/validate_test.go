package squid

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// validSettings is a minimal valid block; cases change one thing.
func validSettings() proxy.Settings {
	return proxy.Settings{
		Port:               3128,
		AllowedClientCIDRs: []string{"10.0.0.0/8"},
	}
}

func TestValidateAccepts(t *testing.T) {
	for name, mod := range map[string]func(*proxy.Settings){
		"minimal":            func(*proxy.Settings) {},
		"port 1":             func(s *proxy.Settings) { s.Port = 1 },
		"port 65535":         func(s *proxy.Settings) { s.Port = 65535 },
		"IPv6 CIDR":          func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"fd00::/8", "2001:db8::1/128"} },
		"explicit 0.0.0.0/0": func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"0.0.0.0/0"} },
		"explicit ::/0":      func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"::/0"} },
		"IPv4-mapped CIDR":   func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"::ffff:10.0.0.0/104"} },
		"unmasked CIDR":      func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"10.1.2.3/8"} },
		"ports":              func(s *proxy.Settings) { s.AllowedPorts = []int32{1, 443, 8443, 65535} },
		"domains": func(s *proxy.Settings) {
			s.AllowedDestinations = []string{"example.com", ".example.org", "localhost", "a-b.c_d.xn--bcher-kva.example", "EXAMPLE.NET"}
		},
		"auth": func(s *proxy.Settings) {
			s.Auth = proxy.Auth{Enabled: true, Username: "Alice", Password: "p a:s%s wörd"}
		},
		"auth off ignores the pair": func(s *proxy.Settings) { s.Auth = proxy.Auth{Username: "a:b"} },
	} {
		t.Run(name, func(t *testing.T) {
			s := validSettings()
			mod(&s)
			if err := Validate(s); err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
		})
	}
}

func TestValidateRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		mod func(*proxy.Settings)
		// want are the FieldErrors' Error() texts, or prefixes of them
		// ending in "…".
		want []string
	}{
		"port 0": {
			mod:  func(s *proxy.Settings) { s.Port = 0 },
			want: []string{"port: 0 is out of range (want 1-65535)"},
		},
		"port too big": {
			mod:  func(s *proxy.Settings) { s.Port = 65536 },
			want: []string{"port: 65536 is out of range (want 1-65535)"},
		},
		"no client CIDRs": {
			mod:  func(s *proxy.Settings) { s.AllowedClientCIDRs = nil },
			want: []string{"allowedClientCIDRs: at least one CIDR is required…"},
		},
		"bare IPv4": {
			mod:  func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"10.0.0.0/8", "10.0.0.1"} },
			want: []string{`allowedClientCIDRs[1]: "10.0.0.1" is not a CIDR (want e.g. 10.0.0.0/8; for this one address write 10.0.0.1/32)`},
		},
		"bare IPv6": {
			mod:  func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"fd00::1"} },
			want: []string{`allowedClientCIDRs[0]: "fd00::1" is not a CIDR (want e.g. fd00::/8; for this one address write fd00::1/128)`},
		},
		"garbage CIDRs": {
			mod: func(s *proxy.Settings) {
				s.AllowedClientCIDRs = []string{"", "10.0.0.0/33", "any", "10.0.0.0/8 ", "fe80::1%eth0/64"}
			},
			want: []string{
				`allowedClientCIDRs[0]: "" is not a CIDR (want e.g. 10.0.0.0/8)`,
				`allowedClientCIDRs[1]: "10.0.0.0/33" is not a CIDR (want e.g. 10.0.0.0/8)`,
				`allowedClientCIDRs[2]: "any" is not a CIDR (want e.g. 10.0.0.0/8)`,
				`allowedClientCIDRs[3]: "10.0.0.0/8 " is not a CIDR (want e.g. 10.0.0.0/8)`,
				`allowedClientCIDRs[4]: "fe80::1%eth0/64" is not a CIDR (want e.g. 10.0.0.0/8)`,
			},
		},
		"IPv6 CIDR covering every IPv4 client": {
			mod:  func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"::/64"} },
			want: []string{`allowedClientCIDRs[0]: "::/64" also covers every IPv4 client…`},
		},
		"bad allowed ports": {
			mod: func(s *proxy.Settings) { s.AllowedPorts = []int32{443, 0, 70000, -1} },
			want: []string{
				"allowedPorts[1]: 0 is out of range (want 1-65535)",
				"allowedPorts[2]: 70000 is out of range (want 1-65535)",
				"allowedPorts[3]: -1 is out of range (want 1-65535)",
			},
		},
		"bad destinations": {
			mod: func(s *proxy.Settings) {
				s.AllowedDestinations = []string{
					"ok.example.com", "", "exa mple.com", "*.example.com", "https://example.com",
					"example.com:443", "10.0.0.1", "[::1]", "bücher.example", "example.com.",
					"a..example.com", "-a.example.com", "a!.example.com", "10.1", ".", strings.Repeat("a", 64) + ".com",
				}
			},
			want: []string{
				`allowedDestinations[1]: must not be empty…`,
				`allowedDestinations[2]: "exa mple.com" contains whitespace…`,
				`allowedDestinations[3]: "*.example.com" has a wildcard; write a leading dot instead…`,
				`allowedDestinations[4]: "https://example.com" is not a domain name…`,
				`allowedDestinations[5]: "example.com:443" is not a domain name…`,
				`allowedDestinations[6]: "10.0.0.1" is an IP address…`,
				`allowedDestinations[7]: "[::1]" is not a domain name…`,
				`allowedDestinations[8]: "bücher.example" is not ASCII…`,
				`allowedDestinations[9]: "example.com." must not end with a dot`,
				`allowedDestinations[10]: "a..example.com" has an empty label…`,
				`allowedDestinations[11]: "-a.example.com" has a label that starts or ends with '-'`,
				`allowedDestinations[12]: "a!.example.com" contains '!'…`,
				`allowedDestinations[13]: "10.1" looks like an IP address…`,
				`allowedDestinations[14]: "." has an empty label…`,
				`allowedDestinations[15]: "` + strings.Repeat("a", 64) + `.com" has a label longer than 63 characters`,
			},
		},
		"auth without credentials": {
			mod: func(s *proxy.Settings) { s.Auth = proxy.Auth{Enabled: true} },
			want: []string{
				"auth.username: must not be empty when auth is enabled",
				"auth.passwordSecretRef: the password is empty; auth needs one",
			},
		},
		"username with colon": {
			mod:  func(s *proxy.Settings) { s.Auth = proxy.Auth{Enabled: true, Username: "user:pw", Password: "pw"} },
			want: []string{"auth.username: must not contain ':' (it separates username and password)"},
		},
		"username with space": {
			mod:  func(s *proxy.Settings) { s.Auth = proxy.Auth{Enabled: true, Username: "a b", Password: "pw"} },
			want: []string{"auth.username: must not contain whitespace or control characters"},
		},
		"username with tab": {
			mod:  func(s *proxy.Settings) { s.Auth = proxy.Auth{Enabled: true, Username: "a\tb", Password: "pw"} },
			want: []string{"auth.username: must not contain whitespace or control characters"},
		},
		"username like a comment": {
			mod:  func(s *proxy.Settings) { s.Auth = proxy.Auth{Enabled: true, Username: "#a", Password: "pw"} },
			want: []string{"auth.username: must not start with '#'…"},
		},
		"password with newline": {
			mod:  func(s *proxy.Settings) { s.Auth = proxy.Auth{Enabled: true, Username: "a", Password: "p\nw"} },
			want: []string{"auth.passwordSecretRef: the password must not contain control characters (a trailing newline, say)"},
		},
		"everything at once": {
			mod: func(s *proxy.Settings) {
				*s = proxy.Settings{AllowedPorts: []int32{0}, AllowedDestinations: []string{"*"}, Auth: proxy.Auth{Enabled: true}}
			},
			want: []string{
				"port: 0 is out of range…",
				"allowedClientCIDRs: at least one CIDR is required…",
				"allowedPorts[0]: 0 is out of range…",
				`allowedDestinations[0]: "*" has a wildcard…`,
				"auth.username: must not be empty…",
				"auth.passwordSecretRef: the password is empty…",
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := validSettings()
			tc.mod(&s)
			err := Validate(s)
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			if !proxy.IsPermanent(err) {
				t.Errorf("Validate() error class = %q, want Permanent", proxy.ClassOf(err))
			}
			var got []string
			var fes fieldErrors
			if !errors.As(err, &fes) {
				t.Fatalf("Validate() = %v, want field errors", err)
			}
			for i, fe := range fes {
				msg := fe.Error()
				if i < len(tc.want) {
					if w, ok := strings.CutSuffix(tc.want[i], "…"); ok && strings.HasPrefix(msg, w) {
						msg = tc.want[i]
					}
				}
				got = append(got, msg)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Validate() problems (-want +got):\n%s", diff)
			}
			// The whole message lists them all on one line.
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("Validate() message spans lines: %q", err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field == "" {
				t.Errorf("errors.As(*FieldError) found nothing in %v", err)
			}
		})
	}
}
