package squid

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// lines returns the configuration lines of conf that start with prefix,
// comments and blank lines left out.
func lines(conf, prefix string) []string {
	var out []string
	for _, l := range strings.Split(conf, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// accessRules are the http_access rules of every conf around the ones
// between, which depend on the settings: first what is always denied (the
// cache manager, the proxy's own port, unsafe ports, CONNECT to other than
// SSL ports, other clients), last the clients allowed and the rest denied.
func accessRules(between ...string) []string {
	rules := []string{
		"http_access deny manager",
		"http_access deny own_port",
		"http_access deny !Safe_ports",
		"http_access deny CONNECT !SSL_ports",
		"http_access deny !clients",
	}
	return append(append(rules, between...), "http_access allow clients", "http_access deny all")
}

func TestRenderAccessRules(t *testing.T) {
	for name, tc := range map[string]struct {
		s    proxy.Settings
		o    Options
		want []string
	}{
		"open to the clients only": {
			s:    proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}},
			want: accessRules("http_access deny never_dst", "http_access deny private_dst"),
		},
		"destinations and auth": {
			s: proxy.Settings{
				Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"},
				AllowedDestinations: []string{"example.com"},
				Auth:                proxy.Auth{Enabled: true, Username: "u", Password: "p"},
			},
			want: accessRules("http_access deny !dest", "http_access deny never_dst", "http_access deny private_dst", "http_access deny !authenticated"),
		},
		"private ranges opened": {
			s:    proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedDestinationCIDRs: []string{"10.20.0.0/16"}},
			want: accessRules("http_access deny never_dst", "http_access deny private_dst"),
		},
	} {
		t.Run(name, func(t *testing.T) {
			f, err := Render(tc.s, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, lines(f.SquidConf, "http_access ")); diff != "" {
				t.Errorf("http_access rules (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRenderDirectives(t *testing.T) {
	auth := proxy.Auth{Enabled: true, Username: "Alice", Password: "correct horse"}
	for name, tc := range map[string]struct {
		s       proxy.Settings
		o       Options
		want    []string // whole lines that must be present
		notWant []string // line prefixes that must be absent
		ht      bool     // htpasswd expected
	}{
		"defaults": {
			s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}},
			want: []string{
				"http_port 3128",
				"pid_filename none",
				"cache_log /dev/stderr",
				"access_log stdio:/dev/stdout",
				"shutdown_lifetime 10 seconds",
				"cache deny all",
				"via off",
				"forwarded_for delete",
				"acl clients src 10.0.0.0/8",
				"acl SSL_ports port 443",
				"acl Safe_ports port 80 443",
			},
			notWant: []string{"cache_dir", "acl dest", "auth_param", "acl authenticated", "cache_effective_user"},
		},
		"options": {
			s: proxy.Settings{Port: 8080, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: auth},
			o: Options{
				HtpasswdPath: "/run/secrets/htpasswd", AuthHelperPath: "/usr/libexec/squid/basic_ncsa_auth",
				PIDFile: "/run/squid.pid", AccessLog: "syslog:daemon.info", CacheLogPath: "/var/log/squid/cache.log",
				ListenAddress: "::1", EffectiveUser: "squid", ShutdownLifetime: 3 * time.Second,
			},
			want: []string{
				"http_port [::1]:8080",
				"pid_filename /run/squid.pid",
				"access_log syslog:daemon.info",
				"cache_log /var/log/squid/cache.log",
				"cache_effective_user squid",
				"shutdown_lifetime 3 seconds",
				"auth_param basic program /usr/libexec/squid/basic_ncsa_auth /run/secrets/htpasswd",
			},
			ht: true,
		},
		"IPv4 listen address": {
			s:    proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}},
			o:    Options{ListenAddress: "127.0.0.1"},
			want: []string{"http_port 127.0.0.1:3128"},
		},
		"ports": {
			s:    proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{8443, 443, 22, 8443}},
			want: []string{"acl SSL_ports port 22 443 8443", "acl Safe_ports port 22 80 443 8443"},
		},
		"auth and destinations": {
			s: proxy.Settings{
				Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: auth,
				AllowedDestinations: []string{"Example.com", ".example.org", "a.example.org"},
			},
			want: []string{
				"acl dest dstdomain -n .example.org example.com",
				"auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/egressproxy.htpasswd",
				"auth_param basic realm egress-proxy",
				"acl authenticated proxy_auth REQUIRED",
			},
			ht: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			f, err := Render(tc.s, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			conf := "\n" + f.SquidConf
			for _, l := range tc.want {
				if !strings.Contains(conf, "\n"+l+"\n") {
					t.Errorf("squid.conf lacks the line %q:\n%s", l, f.SquidConf)
				}
			}
			for _, p := range tc.notWant {
				if strings.Contains(conf, "\n"+p) {
					t.Errorf("squid.conf has a %q line:\n%s", p, f.SquidConf)
				}
			}
			if got := lines(f.SquidConf, "http_access "); len(got) == 0 || got[len(got)-1] != "http_access deny all" {
				t.Errorf("last http_access rule is not \"deny all\": %q", got)
			}
			if got := lines(f.SquidConf, "http_port "); len(got) != 1 {
				t.Errorf("http_port lines = %q, want exactly one", got)
			}
			if tc.ht != (f.Htpasswd != "") {
				t.Errorf("Htpasswd = %q, want it present: %v", f.Htpasswd, tc.ht)
			}
			if tc.ht {
				if !strings.HasPrefix(f.Htpasswd, tc.s.Auth.Username+":$6$") || strings.Count(f.Htpasswd, "\n") != 1 || !strings.HasSuffix(f.Htpasswd, "\n") {
					t.Errorf("Htpasswd = %q, want one line %q", f.Htpasswd, tc.s.Auth.Username+":$6$…")
				}
				if strings.Contains(f.SquidConf, tc.s.Auth.Password) || strings.Contains(f.SquidConf, tc.s.Auth.Username) {
					t.Errorf("squid.conf holds the credentials:\n%s", f.SquidConf)
				}
			}
		})
	}
}

func TestClientCIDRs(t *testing.T) {
	for name, tc := range map[string]struct {
		in, want []string
	}{
		"sorted, IPv4 first":     {[]string{"fd00::/8", "192.168.0.0/16", "10.0.0.0/8"}, []string{"10.0.0.0/8", "192.168.0.0/16", "fd00::/8"}},
		"masked":                 {[]string{"10.1.2.3/8"}, []string{"10.0.0.0/8"}},
		"duplicates":             {[]string{"10.0.0.0/8", "10.0.0.0/8", "10.9.9.9/8"}, []string{"10.0.0.0/8"}},
		"covered dropped":        {[]string{"10.1.0.0/16", "10.0.0.0/8", "10.1.2.3/32"}, []string{"10.0.0.0/8"}},
		"IPv4-mapped as IPv4":    {[]string{"::ffff:10.0.0.0/104"}, []string{"10.0.0.0/8"}},
		"0.0.0.0/0 is IPv4 only": {[]string{"0.0.0.0/0", "10.0.0.0/8", "fd00::/8"}, []string{"0.0.0.0/1", "128.0.0.0/1", "fd00::/8"}},
		"::/0 is IPv6 only":      {[]string{"::/0", "10.0.0.0/8", "fd00::/8"}, []string{"10.0.0.0/8", "::1/128", "1000::/4", "2000::/3", "4000::/2", "8000::/1"}},
		"both halves":            {[]string{"::/0", "0.0.0.0/0"}, []string{"0.0.0.0/1", "128.0.0.0/1", "::1/128", "1000::/4", "2000::/3", "4000::/2", "8000::/1"}},
		"single addresses":       {[]string{"127.0.0.1/32", "::1/128"}, []string{"127.0.0.1/32", "::1/128"}},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, clientCIDRs(tc.in)); diff != "" {
				t.Errorf("clientCIDRs(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestDestinations(t *testing.T) {
	for name, tc := range map[string]struct {
		in, want []string
	}{
		"sorted lower-case":      {[]string{"b.example", "A.example"}, []string{"a.example", "b.example"}},
		"duplicates":             {[]string{"a.example", "A.EXAMPLE"}, []string{"a.example"}},
		"dot covers the apex":    {[]string{"example.com", ".example.com"}, []string{".example.com"}},
		"dot covers subdomains":  {[]string{"a.example.com", ".b.example.com", ".example.com"}, []string{".example.com"}},
		"no false suffix match":  {[]string{"badexample.com", ".example.com"}, []string{".example.com", "badexample.com"}},
		"host does not cover":    {[]string{"example.com", "a.example.com"}, []string{"a.example.com", "example.com"}},
		"single label hostnames": {[]string{"localhost"}, []string{"localhost"}},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, destinations(tc.in)); diff != "" {
				t.Errorf("destinations(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestRenderOptionErrors(t *testing.T) {
	s := proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}
	for name, tc := range map[string]struct {
		o    Options
		want string
	}{
		"space in path":       {Options{HtpasswdPath: "/etc/squid/my file"}, `options.htpasswdPath: "/etc/squid/my file" must not contain whitespace`},
		"newline injection":   {Options{AccessLog: "stdio:/dev/stdout\nhttp_access allow all"}, "options.accessLog: "},
		"relative path":       {Options{AuthHelperPath: "basic_ncsa_auth"}, `options.authHelperPath: "basic_ncsa_auth" is not an absolute path`},
		"pid file relative":   {Options{PIDFile: "squid.pid"}, `options.pidFile: "squid.pid" is not an absolute path`},
		"listen not an IP":    {Options{ListenAddress: "localhost"}, `options.listenAddress: "localhost" is not an IP address`},
		"negative lifetime":   {Options{ShutdownLifetime: -time.Second}, "options.shutdownLifetime: -1s is negative"},
		"comment in the user": {Options{EffectiveUser: "proxy#x"}, `options.effectiveUser: "proxy#x" must not contain`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Render(s, tc.o)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("Render() error = %v, want it to start with %q", err, tc.want)
			}
			if !proxy.IsPermanent(err) {
				t.Errorf("Render() error class = %q, want Permanent", proxy.ClassOf(err))
			}
		})
	}
}

func TestRenderRejectsInvalidSettings(t *testing.T) {
	f, err := Render(proxy.Settings{Port: 3128}, Options{})
	if err == nil || !strings.HasPrefix(err.Error(), "spec.forProvider.proxy.allowedClientCIDRs: ") {
		t.Errorf("Render() error = %v, want the Validate error", err)
	}
	if f != (Files{}) {
		t.Errorf("Render() files = %v on error, want none", f)
	}
}

func TestHash(t *testing.T) {
	base := proxy.Settings{
		Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/9", "192.168.0.0/16"},
		AllowedPorts: []int32{443, 8443},
		Auth:         proxy.Auth{Enabled: true, Username: "u", Password: "p1"},
	}
	o := Options{HtpasswdSalt: "uid-1"}
	render := func(t *testing.T, s proxy.Settings, o Options) Files {
		t.Helper()
		f, err := Render(s, o)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	h0 := Hash(render(t, base, o))
	if len(h0) != 16 {
		t.Errorf("Hash() = %q, want 16 hex digits", h0)
	}

	for name, tc := range map[string]struct {
		mod  func(*proxy.Settings, *Options)
		same bool
	}{
		"same input": {func(*proxy.Settings, *Options) {}, true},
		"reordered lists": {func(s *proxy.Settings, _ *Options) {
			s.AllowedClientCIDRs = []string{"192.168.0.0/16", "10.0.0.0/9"}
			s.AllowedPorts = []int32{8443, 443}
		}, true},
		"password changed":  {func(s *proxy.Settings, _ *Options) { s.Auth.Password = "p2" }, false},
		"username changed":  {func(s *proxy.Settings, _ *Options) { s.Auth.Username = "v" }, false},
		"salt seed changed": {func(_ *proxy.Settings, o *Options) { o.HtpasswdSalt = "uid-2" }, false},
		"port changed":      {func(s *proxy.Settings, _ *Options) { s.Port = 3129 }, false},
		"auth off":          {func(s *proxy.Settings, _ *Options) { s.Auth.Enabled = false }, false},
	} {
		t.Run(name, func(t *testing.T) {
			s, o := base, o
			s.AllowedClientCIDRs = append([]string(nil), base.AllowedClientCIDRs...)
			tc.mod(&s, &o)
			if h := Hash(render(t, s, o)); (h == h0) != tc.same {
				t.Errorf("Hash() = %s, base %s: want same=%v", h, h0, tc.same)
			}
		})
	}

	// The parts are delimited: moving text between the files changes it.
	if Hash(Files{SquidConf: "ab", Htpasswd: "c"}) == Hash(Files{SquidConf: "a", Htpasswd: "bc"}) {
		t.Error("Hash() does not tell the two files apart")
	}
}

// TestSentinelPasswordNeverLeaks feeds a recognizable password through
// every path that produces text and checks that it comes out nowhere but
// hashed in Htpasswd.
func TestSentinelPasswordNeverLeaks(t *testing.T) {
	const pw = "Sentinel-Pa55word-xyzzy"
	good := proxy.Settings{
		Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"},
		Auth: proxy.Auth{Enabled: true, Username: "alice", Password: pw},
	}
	f, err := Render(good, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f.Htpasswd == "" {
		t.Fatal("no htpasswd rendered")
	}
	// The htpasswd hash is as sensitive as the password: a leaked hash can
	// be attacked offline.
	hashPart := strings.TrimSuffix(strings.SplitN(f.Htpasswd, ":", 2)[1], "\n")

	texts := map[string]string{
		"SquidConf":   f.SquidConf,
		"Htpasswd":    f.Htpasswd,
		"Hash":        Hash(f),
		"String":      f.String(),
		"GoString":    f.GoString(),
		"%v":          fmt.Sprintf("%v", f),
		"%+v":         fmt.Sprintf("%+v", f),
		"%#v":         fmt.Sprintf("%#v", f),
		"%s":          fmt.Sprintf("%s", f),
		"%q":          fmt.Sprintf("%q", f),
		"%x":          fmt.Sprintf("%x", f),
		"%d":          fmt.Sprintf("%d", f),
		"pointer %+v": fmt.Sprintf("%+v", &f),
		"in a struct": fmt.Sprintf("%+v", struct{ F Files }{f}),
		"in a slice":  fmt.Sprintf("%v", []Files{f}),
	}
	// Errors, including a password pasted into the username and a password
	// that is itself invalid.
	for name, s := range map[string]proxy.Settings{
		"pasted into username":   {Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: proxy.Auth{Enabled: true, Username: "alice:" + pw, Password: pw}},
		"username with space":    {Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: proxy.Auth{Enabled: true, Username: "alice " + pw, Password: pw}},
		"invalid password":       {Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: proxy.Auth{Enabled: true, Username: "alice", Password: pw + "\n"}},
		"long password":          {Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: proxy.Auth{Enabled: true, Username: "alice", Password: strings.Repeat(pw, 100)}},
		"other fields invalid":   {Port: 0, Auth: proxy.Auth{Enabled: true, Username: "alice", Password: pw}},
		"password as a CIDR":     {Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedDestinations: []string{"#"}, Auth: proxy.Auth{Enabled: true, Username: "#" + pw, Password: pw}},
		"password as a username": {Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: proxy.Auth{Enabled: true, Username: pw + "\t", Password: "x"}},
	} {
		if err := Validate(s); err == nil {
			t.Errorf("%s: Validate() = nil, want an error", name)
		} else {
			texts["Validate "+name] = err.Error()
			texts["Validate %+v "+name] = fmt.Sprintf("%+v", err)
		}
		if _, err := Render(s, Options{}); err == nil {
			t.Errorf("%s: Render() = nil error", name)
		} else {
			texts["Render "+name] = err.Error()
		}
	}
	if _, err := Render(good, Options{HtpasswdPath: "relative " + pw}); err != nil {
		// Options are not secret, but the error must not drag the
		// settings' password along.
		texts["Render options error"] = strings.ReplaceAll(err.Error(), "relative "+pw, "")
	}

	for name, text := range texts {
		if strings.Contains(text, pw) {
			t.Errorf("%s holds the password: %q", name, text)
		}
		if name != "Htpasswd" && strings.Contains(text, hashPart) {
			t.Errorf("%s holds the password hash: %q", name, text)
		}
	}
}
