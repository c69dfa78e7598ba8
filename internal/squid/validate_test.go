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

// withAuth returns a change to the settings that turns auth on with the
// username and password given.
func withAuth(username, password string) func(*proxy.Settings) {
	return func(s *proxy.Settings) { s.Auth = proxy.Auth{Enabled: true, Username: username, Password: password} }
}

func TestValidateAccepts(t *testing.T) {
	for name, mod := range map[string]func(*proxy.Settings){
		"minimal":    func(*proxy.Settings) {},
		"port 1":     func(s *proxy.Settings) { s.Port = 1 },
		"port 65535": func(s *proxy.Settings) { s.Port = 65535 },
		"IPv6 CIDR":  func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"fd00::/33", "2001:db8::1/128"} },
		"0.0.0.0/0 with auth": func(s *proxy.Settings) {
			s.AllowedClientCIDRs = []string{"0.0.0.0/0"}
			s.Auth = proxy.Auth{Enabled: true, Username: "a", Password: "a-long-enough-password"}
		},
		"::/0 with auth": func(s *proxy.Settings) {
			s.AllowedClientCIDRs = []string{"::/0"}
			s.Auth = proxy.Auth{Enabled: true, Username: "a", Password: "a-long-enough-password"}
		},
		"/8 and /32 without auth": func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"11.0.0.0/8", "2001:db8::/32"} },
		"private destination CIDRs": func(s *proxy.Settings) {
			s.AllowedDestinationCIDRs = []string{"10.20.0.0/16", "192.168.1.10/32", "fd12:3456::/32", "100.64.0.0/10", "::ffff:172.16.0.0/108", "fc00::/7", "64:ff9b::a00:0/104"}
		},
		"another proxy port": func(s *proxy.Settings) { s.Port = 8443; s.AllowedPorts = []int32{443} },
		"IPv4-mapped CIDR":   func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"::ffff:10.0.0.0/104"} },
		"unmasked CIDR":      func(s *proxy.Settings) { s.AllowedClientCIDRs = []string{"10.1.2.3/8"} },
		"ports":              func(s *proxy.Settings) { s.AllowedPorts = []int32{1, 443, 8443, 65535} },
		"domains": func(s *proxy.Settings) {
			s.AllowedDestinations = []string{"example.com", ".example.org", "localhost", "a-b.c_d.xn--bcher-kva.example", "EXAMPLE.NET"}
		},
		"auth":                            withAuth("Alice", "p a:s%s wörd"),
		"short password within the limit": withAuth("a", "p"),
		"16-byte password for everyone": func(s *proxy.Settings) {
			s.AllowedClientCIDRs = []string{"0.0.0.0/0", "::/0"}
			s.Auth = proxy.Auth{Enabled: true, Username: "a", Password: "sixteen-bytes-pw"}
		},
		"auth as required":          withAuth("required", "pw"),
		"auth with dashes and dots": withAuth("a-b.c-_REQUIRED", "pw"),
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
		"open to the internet without auth": {
			mod: func(s *proxy.Settings) {
				s.AllowedClientCIDRs = []string{"0.0.0.0/0", "0.0.0.0/1", "128.0.0.0/1", "::/0", "2000::/3", "10.0.0.0/7", "::ffff:0.0.0.0/97", "2001:db8::/31"}
			},
			want: []string{
				`allowedClientCIDRs[0]: "0.0.0.0/0" is broader than /8 (IPv4) or /32 (IPv6), too many clients for a proxy without a password; narrow it, or turn on auth (auth.enabled: true), which makes it allowed`,
				`allowedClientCIDRs[1]: "0.0.0.0/1" is broader than /8…`,
				`allowedClientCIDRs[2]: "128.0.0.0/1" is broader than /8…`,
				`allowedClientCIDRs[3]: "::/0" is broader than /8…`,
				`allowedClientCIDRs[4]: "2000::/3" is broader than /8…`,
				`allowedClientCIDRs[5]: "10.0.0.0/7" is broader than /8…`,
				`allowedClientCIDRs[6]: "::ffff:0.0.0.0/97" is broader than /8…`,
				`allowedClientCIDRs[7]: "2001:db8::/31" is broader than /8…`,
			},
		},
		"proxy port is a destination port": {
			mod:  func(s *proxy.Settings) { s.Port = 443 },
			want: []string{"port: 443 is also a destination port…"},
		},
		"proxy port among allowed ports": {
			mod:  func(s *proxy.Settings) { s.Port = 8443; s.AllowedPorts = []int32{443, 8443} },
			want: []string{"port: 8443 is also a destination port…"},
		},
		"proxy port 80": {
			mod:  func(s *proxy.Settings) { s.Port = 80 },
			want: []string{"port: 80 is also a destination port…"},
		},
		"destination CIDRs that are never opened": {
			mod: func(s *proxy.Settings) {
				s.AllowedDestinationCIDRs = []string{"10.0.0.0/8", "127.0.0.1/32", "0.0.0.0/0", "169.254.169.254/32", "::1/128", "::ffff:127.0.0.0/104",
					"224.0.0.1/32", "64:ff9b::7f00:1/128", "2002:a9fe::/32", "fe80::/10", "10.0.0.1", "10.0.0.0/7", "8.8.8.0/24", "::/0", "0.0.0.0/1",
					"64:ff9b:1::/48", "64:ff9b:1:a9fe:a9fe::/80"}
			},
			want: []string{
				`allowedDestinationCIDRs[1]: "127.0.0.1/32" is not inside a private range (10.0.0.0/8, 100.64.0.0/10, 172.16.0.0/12, 192.0.0.0/24, 192.168.0.0/16, fc00::/7); only those are denied and can be opened: the proxy host, link-local and metadata addresses and local-use NAT64 (64:ff9b:1::/48) never are, and public addresses need no opening`,
				`allowedDestinationCIDRs[2]: "0.0.0.0/0" is not inside a private range…`,
				`allowedDestinationCIDRs[3]: "169.254.169.254/32" is not inside a private range…`,
				`allowedDestinationCIDRs[4]: "::1/128" is not inside a private range…`,
				`allowedDestinationCIDRs[5]: "::ffff:127.0.0.0/104" is not inside a private range…`,
				`allowedDestinationCIDRs[6]: "224.0.0.1/32" is not inside a private range…`,
				`allowedDestinationCIDRs[7]: "64:ff9b::7f00:1/128" is not inside a private range…`,
				`allowedDestinationCIDRs[8]: "2002:a9fe::/32" is not inside a private range…`,
				`allowedDestinationCIDRs[9]: "fe80::/10" is not inside a private range…`,
				`allowedDestinationCIDRs[10]: "10.0.0.1" is not a CIDR…`,
				`allowedDestinationCIDRs[11]: "10.0.0.0/7" is not inside a private range…`,
				`allowedDestinationCIDRs[12]: "8.8.8.0/24" is not inside a private range…`,
				`allowedDestinationCIDRs[13]: "::/0" is not inside a private range…`,
				`allowedDestinationCIDRs[14]: "0.0.0.0/1" is not inside a private range…`,
				`allowedDestinationCIDRs[15]: "64:ff9b:1::/48" is not inside a private range…`,
				`allowedDestinationCIDRs[16]: "64:ff9b:1:a9fe:a9fe::/80" is not inside a private range…`,
			},
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
					"2130706433", "0x7f000001", "0X7F.1", "0177.0.0.1",
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
				`allowedDestinations[16]: "2130706433" looks like an IP address…`,
				`allowedDestinations[17]: "0x7f000001" looks like an IP address…`,
				`allowedDestinations[18]: "0X7F.1" looks like an IP address…`,
				`allowedDestinations[19]: "0177.0.0.1" looks like an IP address…`,
			},
		},
		"auth without credentials": {
			mod: withAuth("", ""),
			want: []string{
				"auth.username: must not be empty when auth is enabled",
				"auth.passwordSecretRef: the password is empty; auth needs one",
			},
		},
		"username with colon":     {mod: withAuth("user:pw", "pw"), want: []string{"auth.username: must not contain ':' (it separates username and password)"}},
		"username with space":     {mod: withAuth("a b", "pw"), want: []string{"auth.username: must not contain whitespace or control characters"}},
		"username with tab":       {mod: withAuth("a\tb", "pw"), want: []string{"auth.username: must not contain whitespace or control characters"}},
		"username like a comment": {mod: withAuth("#a", "pw"), want: []string{"auth.username: must not start with '#'…"}},
		"username REQUIRED":       {mod: withAuth("REQUIRED", "pw"), want: []string{"auth.username: must not be REQUIRED (Squid reads it as any valid user); choose another name"}},
		"username like an option": {mod: withAuth("-i", "pw"), want: []string{"auth.username: must not start with '-' or a quote (Squid would read an ACL option or a file name); start with a letter, digit, '.' or '_'"}},
		"username like a file":    {mod: withAuth(`"/etc/passwd"`, "pw"), want: []string{"auth.username: must not start with '-' or a quote…"}},
		"egress check username REQUIRED": {
			mod: func(s *proxy.Settings) {
				s.EgressCheck = &proxy.EgressCheck{URL: "https://echo.example.com/ip", Username: "REQUIRED", Password: "pw"}
			},
			want: []string{"egressCheck.username: must not be REQUIRED…"},
		},
		// A URL stored before the CRD refused user info and queries: its
		// credentials are not quoted.
		"egress check URL with user info": {
			mod: func(s *proxy.Settings) {
				s.EgressCheck = &proxy.EgressCheck{URL: "https://echo-user:S3NT1NEL-url-pw@echo.example.com/ip", Username: CheckUsername, Password: "pw"}
			},
			want: []string{"egressCheck.url: must not hold user info (the URL is not shown: it holds user info, a query or a fragment)"},
		},
		"egress check URL with user info that does not parse": {
			mod: func(s *proxy.Settings) {
				s.EgressCheck = &proxy.EgressCheck{URL: "https://echo-user:S3NT1NEL-url-pw%zz@echo.example.com/ip", Username: CheckUsername, Password: "pw"}
			},
			want: []string{"egressCheck.url: is not a URL (the URL is not shown: it holds user info, a query or a fragment)"},
		},
		"egress check URL with a token in its query": {
			mod: func(s *proxy.Settings) {
				s.EgressCheck = &proxy.EgressCheck{URL: "https://echo.example.com/ip?token=S3NT1NEL-url-pw", Username: CheckUsername, Password: "pw"}
			},
			want: []string{"egressCheck.url: must have no query or fragment (the URL is not shown: it holds user info, a query or a fragment)"},
		},
		"egress check URL refused otherwise": {
			mod: func(s *proxy.Settings) {
				s.EgressCheck = &proxy.EgressCheck{URL: "ftp://echo.example.com/ip", Username: CheckUsername, Password: "pw"}
			},
			want: []string{`egressCheck.url: "ftp://echo.example.com/ip" has scheme "ftp"; want http or https`},
		},
		"password with newline": {mod: withAuth("a", "p\nw"), want: []string{"auth.passwordSecretRef: the password must not contain control characters (a trailing newline, say)"}},
		"short password for every IPv4 client": {
			mod: func(s *proxy.Settings) {
				s.AllowedClientCIDRs = []string{"0.0.0.0/0"}
				s.Auth = proxy.Auth{Enabled: true, Username: "a", Password: "fifteen-bytes!!"}
			},
			want: []string{"auth.passwordSecretRef: the password is shorter than 16 bytes, and the clients' ranges are broader than a proxy without auth may serve…"},
		},
		"short password for two /8s together": {
			mod: func(s *proxy.Settings) {
				s.AllowedClientCIDRs = []string{"10.0.0.0/8", "11.0.0.0/8"}
				s.Auth = proxy.Auth{Enabled: true, Username: "a", Password: "a"}
			},
			want: []string{"auth.passwordSecretRef: the password is shorter than 16 bytes…"},
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
				msg := fe.Field + ": " + fe.Detail
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

// A problem names the field where the user writes it.
func TestFieldErrorPath(t *testing.T) {
	for field, want := range map[string]string{
		"allowedClientCIDRs[0]": "spec.forProvider.proxy.allowedClientCIDRs[0]: x",
		"auth.username":         "spec.forProvider.proxy.auth.username: x",
		"egressCheck.url":       "the ProviderConfig's egressCheck.url: x",
		"options.pidFile":       "options.pidFile: x",
	} {
		if got := (&FieldError{Field: field, Detail: "x"}).Error(); got != want {
			t.Errorf("%s: %q, want %q", field, got, want)
		}
	}
}
