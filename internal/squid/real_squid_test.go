package squid

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/netnshost"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// These tests run Debian's real Squid. hack/install-squid.sh installs it.

const installHint = "squid not found in PATH or at /usr/sbin/squid: run hack/install-squid.sh (installs Debian's squid package)"

// TestOwnAddressesMissingStopsSquid: squid.conf includes the machine's
// own addresses, so Squid refuses a configuration whose list is missing
// or empty, where a missing list file would have been an empty ACL, and
// the machine's own addresses open.
func TestOwnAddressesMissingStopsSquid(t *testing.T) {
	bin := squidBinary(t)
	dir := worldReadableDir(t)
	own := filepath.Join(dir, "own-addresses.conf")
	f, err := Render(proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedDestinationCIDRs: []string{"10.0.0.0/8"}},
		Options{ListenAddress: "127.0.0.1", OwnAddressesFile: own})
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "squid.conf")
	writeReadable(t, conf, f.SquidConf)
	parse := func() error { return exec.Command(bin, "-k", "parse", "-f", conf).Run() }
	if err := parse(); err == nil {
		t.Error("Squid accepts the configuration without the list of its own addresses")
	}
	writeReadable(t, own, "")
	if err := parse(); err == nil {
		t.Error("Squid accepts the configuration with an empty list of its own addresses")
	}
	writeReadable(t, own, "acl own_dst dst 127.0.0.1\nacl own_dst dst ::1\nacl own_dst dst 10.0.0.5\n")
	if out, err := exec.Command(bin, "-k", "parse", "-f", conf).CombinedOutput(); err != nil {
		t.Errorf("squid -k parse with the list: %v\n%s", err, out)
	}
}

// squidBinary finds squid. Without it, the test skips on a developer's
// machine but fails in CI (CI set) or when EGRESSPROXY_REQUIRE_SQUID=1, so
// that a CI machine without Squid never passes by skipping.
func squidBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("squid"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/squid"); err == nil {
		return "/usr/sbin/squid"
	}
	if ci := os.Getenv("CI"); (ci != "" && ci != "false" && ci != "0") || os.Getenv("EGRESSPROXY_REQUIRE_SQUID") == "1" {
		t.Fatal(installHint + " (CI or EGRESSPROXY_REQUIRE_SQUID=1 is set, so this test does not skip)")
	}
	t.Skip(installHint)
	return ""
}

// helperPath is basic_ncsa_auth where Debian puts it, or next to squid.
func helperPath(t *testing.T, squid string) string {
	t.Helper()
	for _, p := range []string{
		DefaultAuthHelperPath,
		filepath.Join(filepath.Dir(squid), "..", "lib", "squid", "basic_ncsa_auth"),
		filepath.Join(filepath.Dir(squid), "..", "libexec", "squid", "basic_ncsa_auth"),
	} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("basic_ncsa_auth not found next to %s; run hack/install-squid.sh", squid)
	return ""
}

// worldReadableDir makes a temporary folder that Squid can read after it
// drops from root to its effective user (proxy on Debian): t.TempDir is
// 0700.
func worldReadableDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "egressproxy-squid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func writeReadable(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSquidParsesEveryVariant runs `squid -k parse` on rendered variants
// and fails on any ERROR, FATAL or unexpected WARNING, so that overlap
// warnings (which mean Squid silently changed the ACL) are caught too.
func TestSquidParsesEveryVariant(t *testing.T) {
	bin := squidBinary(t)
	auth := proxy.Auth{Enabled: true, Username: "alice", Password: "a-long-enough-secret"}
	for name, tc := range map[string]struct {
		s proxy.Settings
		o Options
	}{
		"minimal":                {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}},
		"auth":                   {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: auth}},
		"destinations":           {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedDestinations: []string{"example.com", ".example.com", "a.example.org", ".b.example.org", ".example.org", "localhost"}}},
		"auth and destinations":  {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedDestinations: []string{".example.com"}, Auth: auth}},
		"several ports":          {s: proxy.Settings{Port: 8080, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{443, 8443, 22, 5432, 443}}},
		"IPv6 CIDRs":             {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"fd00::/33", "2001:db8::/33", "10.0.0.0/9", "::ffff:192.168.0.0/112"}}},
		"overlapping CIDRs":      {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.3/32", "10.1.2.3/8", "fd00::/32", "fd00::/48"}}},
		"0.0.0.0/0":              {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"0.0.0.0/0", "10.0.0.0/8"}, Auth: auth}},
		"::/0":                   {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"::/0", "fd00::/8", "::1/128"}, Auth: auth}},
		"IPv6 listen address":    {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"::1/128"}}, o: Options{ListenAddress: "::1"}},
		"VM-like options":        {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: auth}, o: Options{PIDFile: "/run/squid.pid", AccessLog: "stdio:/var/log/squid/access.log", CacheLogPath: "/var/log/squid/cache.log", EffectiveUser: "proxy"}},
		"syslog access log":      {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}, o: Options{AccessLog: "syslog:daemon.info"}},
		"opened and denied":      {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"127.0.0.0/8"}, AllowedDestinationCIDRs: []string{"10.20.0.0/16", "10.20.1.0/24", "fd12::/16", "192.168.1.1/32"}}, o: Options{ListenAddress: "127.0.0.1", DeniedDestinationCIDRs: []string{"10.96.0.0/12", "10.96.0.1", "10.244.0.0/16", "fd00:10:96::/112", "192.0.2.7"}, HostsFile: "/etc/hosts", DNSNameservers: []string{"127.0.0.53", "::1"}}},
		"everything at once":     {s: proxy.Settings{Port: 65535, AllowedClientCIDRs: []string{"0.0.0.0/0", "::/0"}, AllowedPorts: []int32{1, 65534}, AllowedDestinations: []string{"xn--bcher-kva.example", "_srv.example.net"}, AllowedDestinationCIDRs: []string{"10.0.0.0/8", "fc00::/7"}, Auth: auth}, o: Options{ShutdownLifetime: time.Minute}},
		"username with specials": {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: proxy.Auth{Enabled: true, Username: "Mixed.Case-user_1@corp", Password: "x"}}},
		"longest lists":          {s: longestLists()},
		"addresses opened":       {s: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedDestinationCIDRs: []string{"fdff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/128", "fc00::1/128", "10.255.255.254/32", "64:ff9b::c0a8:ffff/128", "2002:ac1f:ffff::/48"}}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f, err := Render(tc.s, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			conf := filepath.Join(t.TempDir(), "squid.conf")
			writeReadable(t, conf, f.SquidConf)
			out, err := exec.Command(bin, "-k", "parse", "-f", conf).CombinedOutput()
			if err != nil {
				t.Fatalf("squid -k parse: %v\n%s\nsquid.conf:\n%s", err, out, f.SquidConf)
			}
			for _, l := range strings.Split(string(out), "\n") {
				bad := strings.Contains(l, "ERROR") || strings.Contains(l, "FATAL") || strings.Contains(l, "WARNING")
				// via off is required of us; Squid says so every time.
				if bad && !strings.Contains(l, "WARNING: HTTP requires the use of Via") {
					t.Errorf("squid -k parse: %s", l)
				}
			}
			if t.Failed() {
				t.Logf("squid.conf:\n%s", f.SquidConf)
			}
		})
	}
}

// rfc1738Escape escapes s as Squid does before handing credentials to a
// basic auth helper.
func rfc1738Escape(s string) string {
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// TestHtpasswdAcceptedByBasicNCSAAuth proves the hash format with the
// helper Squid runs, without a proxy in between.
func TestHtpasswdAcceptedByBasicNCSAAuth(t *testing.T) {
	helper := helperPath(t, squidBinary(t))
	const user, pw = "Alice", "pä ss:w%rd with spaces and a long tail 0123456789012345678901234567890123456789"
	f, err := Render(proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: proxy.Auth{Enabled: true, Username: user, Password: pw}}, Options{HtpasswdSalt: "uid"})
	if err != nil {
		t.Fatal(err)
	}
	ht := filepath.Join(t.TempDir(), "htpasswd")
	writeReadable(t, ht, f.Htpasswd)

	in := strings.Join([]string{
		rfc1738Escape(user) + " " + rfc1738Escape(pw),
		rfc1738Escape(user) + " " + rfc1738Escape(pw[:len(pw)-1]),
		rfc1738Escape(user) + " " + rfc1738Escape(pw[:8]), // DES-crypt would accept this
		rfc1738Escape("alice") + " " + rfc1738Escape(pw),
	}, "\n") + "\n"
	cmd := exec.Command(helper, ht)
	cmd.Stdin = strings.NewReader(in)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", helper, err, out)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{"OK", "ERR", "ERR", "ERR"}
	if len(got) != len(want) {
		t.Fatalf("basic_ncsa_auth answered %q, want %q", got, want)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("answer %d = %q, want %s", i, got[i], want[i])
		}
	}
}

// liveSquid is a squid running in the foreground for one test.
type liveSquid struct {
	// addr is host:port to use as the proxy.
	addr string
	log  string
}

// startSquid renders s and o, starts `squid -N` on a free loopback port and
// waits until it accepts connections. The process group is killed when the
// test ends. edit, when given, changes the configuration first (a Squid
// the provider did not configure).
func startSquid(t *testing.T, bin string, s proxy.Settings, o Options, edit ...func(conf string) string) *liveSquid {
	t.Helper()
	dir := worldReadableDir(t)
	network, host := "tcp4", "127.0.0.1"
	if o.ListenAddress != "" {
		host = o.ListenAddress
		if strings.Contains(host, ":") {
			network = "tcp6"
		}
	} else {
		o.ListenAddress = host
	}
	// A free port, and with TLS the next one too: the plain loopback
	// listener of a TLS proxy (ReportPort).
	for attempt := 0; ; attempt++ {
		l, err := net.Listen(network, net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		s.Port = int32(l.Addr().(*net.TCPAddr).Port) //nolint:forcetypeassert,gosec // A TCP listener's port fits.
		next, err := net.Listen(network, net.JoinHostPort(host, strconv.Itoa(int(s.Port)+1)))
		_ = l.Close()
		if err == nil {
			_ = next.Close()
			break
		}
		if s.TLS == nil || attempt == 20 {
			break
		}
	}

	o.HtpasswdPath = filepath.Join(dir, "htpasswd")
	o.TLSCertPath, o.TLSKeyPath = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	f, err := Render(s, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range edit {
		f.SquidConf = e(f.SquidConf)
	}
	conf := filepath.Join(dir, "squid.conf")
	writeReadable(t, conf, f.SquidConf)
	if f.Htpasswd != "" {
		writeReadable(t, o.HtpasswdPath, f.Htpasswd)
	}
	if f.TLSCert != "" {
		writeReadable(t, o.TLSCertPath, f.TLSCert)
		writeReadable(t, o.TLSKeyPath, f.TLSKey)
	}
	// Squid opens /dev/stdout by name after dropping privileges, so its
	// stdout must be a file its user may open, not a pipe of ours.
	logPath := filepath.Join(dir, "squid.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	if err := os.Chmod(logPath, 0o666); err != nil {
		t.Fatal(err)
	}

	// A service name of its own per squid: Squid names its shared memory
	// segments (/dev/shm/<name>-cf__*.shm) after it, and squids running in
	// parallel must not share them.
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "ept" + hex.EncodeToString(rnd[:]) // Squid takes letters and digits only
	cmd := exec.Command(bin, "-N", "-n", name, "-f", conf)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	sq := &liveSquid{addr: net.JoinHostPort(host, strconv.Itoa(int(s.Port))), log: logPath}
	t.Cleanup(func() {
		// Squid's helpers run in sessions of their own and exit when
		// squid's end of their pipes closes; the group is for anything else
		// squid may have started.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited //nolint:errcheck // Squid was killed: its exit status says nothing.
		// A killed squid leaves its segments behind; only ours are removed.
		shm, _ := filepath.Glob("/dev/shm/" + name + "-*")
		for _, p := range shm {
			_ = os.Remove(p)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("squid.conf:\n%s\nsquid output:\n%s", f.SquidConf, b)
		}
	})

	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", sq.addr, time.Second)
		if err == nil {
			_ = c.Close()
			return sq
		}
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			b, _ := os.ReadFile(logPath)
			t.Fatalf("squid exited before listening: %v\n%s", err, b)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("squid did not listen on %s within 15 s", sq.addr)
		}
	}
}

// seen is what the upstream test server received, echoed in its body.
type seen struct {
	Via, XForwardedFor, Forwarded, ProxyAuthorization string
}

// upstream answers every request with what it saw of the proxy, and
// netnshost.EchoPath with the address the request came from.
func upstream(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == netnshost.EchoPath {
		netnshost.Echo(w, r)
		return
	}
	_ = json.NewEncoder(w).Encode(seen{
		Via:                r.Header.Get("Via"),
		XForwardedFor:      r.Header.Get("X-Forwarded-For"),
		Forwarded:          r.Header.Get("Forwarded"),
		ProxyAuthorization: r.Header.Get("Proxy-Authorization"),
	})
}

// result is one request's outcome through the proxy.
type result struct {
	status     int    // the proxy's status for CONNECT, else the response's
	squidError string // X-Squid-Error: ERR_ACCESS_DENIED, ERR_CACHE_ACCESS_DENIED
	challenge  string // Proxy-Authenticate
	seen       seen
	err        error
}

// client sends requests through a proxy with Go's own proxy support.
type client struct {
	proxy *url.URL
	roots *x509.CertPool
	// serverName overrides the TLS name to verify; default example.com,
	// which the test certificate names (the test host's address it does
	// not).
	serverName string
}

func (c client) get(t *testing.T, target string) result {
	t.Helper()
	var res result
	if c.serverName == "" {
		c.serverName = "example.com"
	}
	tr := &http.Transport{
		Proxy:             http.ProxyURL(c.proxy),
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: c.roots, ServerName: c.serverName, MinVersion: tls.VersionTLS12},
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, r *http.Response) error {
			res.status = r.StatusCode
			res.squidError = r.Header.Get("X-Squid-Error")
			res.challenge = r.Header.Get("Proxy-Authenticate")
			return nil
		},
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		res.err = err
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	res.squidError = resp.Header.Get("X-Squid-Error")
	res.challenge = resp.Header.Get("Proxy-Authenticate")
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body.Bytes(), &res.seen); err != nil {
			res.err = fmt.Errorf("upstream body %q: %w", body.String(), err)
		}
	}
	return res
}

// expect checks a result: want is the status; for 403 and 407 it must be
// Squid's own denial (not, say, a 403 from the upstream).
func expect(t *testing.T, what string, got result, want int) {
	t.Helper()
	if got.status != want {
		t.Errorf("%s: status %d (X-Squid-Error %q, err %v), want %d", what, got.status, got.squidError, got.err, want)
		return
	}
	switch want {
	case http.StatusOK:
		if got.err != nil {
			t.Errorf("%s: %v", what, got.err)
		}
		if got.seen != (seen{}) {
			t.Errorf("%s: upstream saw proxy headers %+v, want none (via off, forwarded_for delete, credentials consumed)", what, got.seen)
		}
	case http.StatusForbidden:
		if !strings.HasPrefix(got.squidError, "ERR_ACCESS_DENIED") {
			t.Errorf("%s: X-Squid-Error %q, want ERR_ACCESS_DENIED", what, got.squidError)
		}
	case http.StatusProxyAuthRequired:
		if !strings.HasPrefix(got.squidError, "ERR_CACHE_ACCESS_DENIED") {
			t.Errorf("%s: X-Squid-Error %q, want ERR_CACHE_ACCESS_DENIED", what, got.squidError)
		}
		if want := `Basic realm="` + Realm + `"`; got.challenge != want {
			t.Errorf("%s: Proxy-Authenticate %q, want %q", what, got.challenge, want)
		}
	}
}

// upstreams are the test's upstream servers, on a test host of its own
// (testenv.NewTestHost) where a real destination would stand.
type upstreams struct {
	host          *testenv.TestHost
	plain, secure string // URLs
	plainPort     int32
	securePort    int32
	roots         *x509.CertPool
	hostsFile     string // names for Squid's hosts_file
}

// startUpstreams serves upstream over HTTP and HTTPS on a test host, and
// writes a hosts file naming it upstream.test (and other names in names).
func startUpstreams(t *testing.T, names map[string][]string) *upstreams {
	t.Helper()
	h := testenv.NewTestHost(t)
	plain := httptest.NewUnstartedServer(http.HandlerFunc(upstream))
	_ = plain.Listener.Close()
	plain.Listener = h.Listen(t, "tcp", ":0")
	plain.Start()
	t.Cleanup(plain.Close)
	secure := httptest.NewUnstartedServer(http.HandlerFunc(upstream))
	_ = secure.Listener.Close()
	secure.Listener = h.Listen(t, "tcp", ":0")
	secure.StartTLS()
	t.Cleanup(secure.Close)
	u := &upstreams{host: h, plain: plain.URL, secure: secure.URL, roots: x509.NewCertPool()}
	u.roots.AddCert(secure.Certificate())
	u.plainPort = int32(plain.Listener.Addr().(*net.TCPAddr).Port)   //nolint:gosec,forcetypeassert // a TCP port.
	u.securePort = int32(secure.Listener.Addr().(*net.TCPAddr).Port) //nolint:gosec,forcetypeassert // a TCP port.
	var hosts strings.Builder
	fmt.Fprintf(&hosts, "%s upstream.test upstream.example.test other.test\n", h.Addr)
	for name, addrs := range names {
		for _, a := range addrs {
			fmt.Fprintf(&hosts, "%s %s\n", a, name)
		}
	}
	u.hostsFile = filepath.Join(worldReadableDir(t), "hosts")
	writeReadable(t, u.hostsFile, hosts.String())
	return u
}

// options are the Options of a test squid: names from the hosts file, and
// DNS asked of the test host only (where nothing answers), so that no
// query leaves this machine.
func (u *upstreams) options(helper string) Options {
	return Options{AuthHelperPath: helper, HtpasswdSalt: "test-uid", HostsFile: u.hostsFile, DNSNameservers: []string{u.host.Addr.String()}}
}

// TestRealSquid runs rendered configurations in real squids and talks to
// upstream servers on a test host through them.
func TestRealSquid(t *testing.T) {
	bin := squidBinary(t)
	helper := helperPath(t, bin)
	up := startUpstreams(t, nil)
	roots := up.roots
	plainPort, securePort := up.plainPort, up.securePort
	plain := struct{ URL string }{up.plain}
	secure := struct{ URL string }{up.secure}
	upHost := up.host.Addr.String()
	// Nothing listens on the discard port; Squid must refuse before trying.
	const otherPort = 9
	ports := []int32{plainPort, securePort}

	const user, pw = "Alice", "pä ss:w%rd@with/odd#chars"
	auth := proxy.Auth{Enabled: true, Username: user, Password: pw}
	test := up.options(helper)

	proxyURL := func(sq *liveSquid, ui *url.Userinfo) *url.URL {
		return &url.URL{Scheme: "http", Host: sq.addr, User: ui}
	}
	at := func(host string, p int32) string { return net.JoinHostPort(host, strconv.Itoa(int(p))) }

	t.Run("allowed client", func(t *testing.T) {
		t.Parallel()
		sq := startSquid(t, bin, proxy.Settings{AllowedClientCIDRs: []string{"127.0.0.0/8"}, AllowedPorts: ports}, test)
		c := client{proxy: proxyURL(sq, nil), roots: roots}
		expect(t, "plain http", c.get(t, plain.URL), http.StatusOK)
		expect(t, "https through CONNECT", c.get(t, secure.URL), http.StatusOK)
		expect(t, "by name, CONNECT", c.get(t, "https://"+at("upstream.test", securePort)+"/"), http.StatusOK)
		expect(t, "CONNECT to a port not allowed", c.get(t, "https://"+at(upHost, otherPort)+"/"), http.StatusForbidden)
		expect(t, "plain http to a port not allowed", c.get(t, "http://"+at(upHost, otherPort)+"/"), http.StatusForbidden)
	})

	t.Run("basic auth", func(t *testing.T) {
		t.Parallel()
		sq := startSquid(t, bin, proxy.Settings{AllowedClientCIDRs: []string{"127.0.0.0/8"}, AllowedPorts: ports, Auth: auth}, test)
		for name, ui := range map[string]*url.Userinfo{
			"no credentials":   nil,
			"wrong password":   url.UserPassword(user, pw+"x"),
			"password prefix":  url.UserPassword(user, pw[:8]),
			"wrong user":       url.UserPassword("Bob", pw),
			"lower-case user":  url.UserPassword("alice", pw),
			"username only":    url.User(user),
			"empty everything": url.UserPassword("", ""),
		} {
			c := client{proxy: proxyURL(sq, ui), roots: roots}
			expect(t, name+", plain http", c.get(t, plain.URL), http.StatusProxyAuthRequired)
			expect(t, name+", CONNECT", c.get(t, secure.URL), http.StatusProxyAuthRequired)
		}
		c := client{proxy: proxyURL(sq, url.UserPassword(user, pw)), roots: roots}
		expect(t, "right credentials, plain http", c.get(t, plain.URL), http.StatusOK)
		expect(t, "right credentials, CONNECT", c.get(t, secure.URL), http.StatusOK)
		expect(t, "right credentials, port not allowed", c.get(t, "https://"+at(upHost, otherPort)+"/"), http.StatusForbidden)
	})

	t.Run("client outside the CIDRs gets 403 not 407", func(t *testing.T) {
		t.Parallel()
		sq := startSquid(t, bin, proxy.Settings{AllowedClientCIDRs: []string{"10.9.0.0/16"}, AllowedPorts: ports, Auth: auth}, test)
		for name, ui := range map[string]*url.Userinfo{"no credentials": nil, "right credentials": url.UserPassword(user, pw)} {
			c := client{proxy: proxyURL(sq, ui), roots: roots}
			expect(t, name+", plain http", c.get(t, plain.URL), http.StatusForbidden)
			expect(t, name+", CONNECT", c.get(t, secure.URL), http.StatusForbidden)
		}
	})

	t.Run("destination allow-list", func(t *testing.T) {
		t.Parallel()
		// upstream.test resolves to the test host (the hosts file); its
		// address itself is not a listed name, and -n keeps Squid from
		// matching it by reverse DNS.
		sq := startSquid(t, bin, proxy.Settings{
			AllowedClientCIDRs:  []string{"127.0.0.0/8"},
			AllowedPorts:        ports,
			AllowedDestinations: []string{"upstream.test", ".example.test"},
		}, test)
		c := client{proxy: proxyURL(sq, nil), roots: roots}
		expect(t, "listed name, plain http", c.get(t, "http://"+at("upstream.test", plainPort)+"/"), http.StatusOK)
		expect(t, "listed name, CONNECT", c.get(t, "https://"+at("upstream.test", securePort)+"/"), http.StatusOK)
		expect(t, "listed domain, CONNECT", c.get(t, "https://"+at("upstream.example.test", securePort)+"/"), http.StatusOK)
		expect(t, "IP address, plain http", c.get(t, plain.URL), http.StatusForbidden)
		expect(t, "IP address, CONNECT", c.get(t, secure.URL), http.StatusForbidden)
		expect(t, "unlisted name", c.get(t, "http://"+at("other.test", plainPort)+"/"), http.StatusForbidden)
	})

	// Squid reads 0.0.0.0/0 as every client, IPv6 too, and matches IPv4
	// clients against IPv6 CIDRs; the rendering undoes both. (Such CIDRs
	// need auth.)
	t.Run("0.0.0.0/0 and ::/0 keep to their family", func(t *testing.T) {
		t.Parallel()
		if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
			t.Skipf("no IPv6 loopback here: %v", err)
		} else {
			_ = l.Close()
		}
		for name, tc := range map[string]struct {
			listen string
			cidrs  []string
			want   int
		}{
			"IPv6 client, 0.0.0.0/0": {"::1", []string{"0.0.0.0/0"}, http.StatusForbidden},
			"IPv4 client, 0.0.0.0/0": {"127.0.0.1", []string{"0.0.0.0/0"}, http.StatusOK},
			"IPv6 client, ::/0":      {"::1", []string{"::/0"}, http.StatusOK},
			"IPv4 client, ::/0":      {"127.0.0.1", []string{"::/0"}, http.StatusForbidden},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				o := test
				o.ListenAddress = tc.listen
				sq := startSquid(t, bin, proxy.Settings{AllowedClientCIDRs: tc.cidrs, AllowedPorts: ports, Auth: auth}, o)
				expect(t, "plain http", client{proxy: proxyURL(sq, url.UserPassword(user, pw))}.get(t, plain.URL), tc.want)
			})
		}
	})
}

// serveDNS answers A and AAAA queries for names (fully qualified) with
// their addresses, on port 53 of a loopback address of its own (Squid asks
// nameservers on port 53 only), until t ends. It returns the address.
func serveDNS(t *testing.T, names map[string][]string) string {
	t.Helper()
	var r [2]byte
	_, _ = rand.Read(r[:])
	addr := netip.AddrFrom4([4]byte{127, 64 + r[0]%64, r[1], 53})
	pc, err := net.ListenPacket("udp4", netip.AddrPortFrom(addr, 53).String())
	if err != nil {
		t.Fatalf("a DNS server for the test: %v", err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true})
			_ = b.StartQuestions()
			_ = b.Question(q)
			_ = b.StartAnswers()
			rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}
			for _, s := range names[strings.ToLower(q.Name.String())] {
				switch a := netip.MustParseAddr(s); {
				case a.Is4() && q.Type == dnsmessage.TypeA:
					_ = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
				case a.Is6() && q.Type == dnsmessage.TypeAAAA:
					_ = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
				}
			}
			if msg, err := b.Finish(); err == nil {
				_, _ = pc.WriteTo(msg, from)
			}
		}
	}()
	return addr.String()
}

// nat64 spells an IPv4 address in NAT64's well-known prefix.
func nat64(a netip.Addr) string {
	v4 := a.As4()
	return netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 12: v4[0], 13: v4[1], 14: v4[2], 15: v4[3]}).String()
}

// countingListener counts the connections a listener accepted, to prove a
// denied request never reached it.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestRealSquidDeniesPivots is the attack of a client of the proxy that
// aims it at the network the proxy stands in: the proxy host itself, link
// local and metadata services, private ranges, by address in every
// spelling and by names that resolve there. Where an address can be bound
// (loopback here, private addresses on a test host), something listens,
// so a 403 proves the denial and not a dead end; the rest must be Squid's
// own 403 (ERR_ACCESS_DENIED, TCP_DENIED in its access log), given before
// any connection is tried.
func TestRealSquidDeniesPivots(t *testing.T) {
	bin := squidBinary(t)
	helper := helperPath(t, bin)
	// Random addresses of each private range, none on a network this
	// machine routes: the test host takes their traffic.
	random := func(f func(r [3]byte) netip.Addr) netip.Addr {
		return netnshost.Unrouted(func() netip.Addr {
			var r [3]byte
			_, _ = rand.Read(r[:])
			return f(r)
		})
	}
	private := []netip.Addr{
		random(func(r [3]byte) netip.Addr { return netip.AddrFrom4([4]byte{10, r[0], r[1], r[2] | 1}) }),
		random(func(r [3]byte) netip.Addr { return netip.AddrFrom4([4]byte{172, 16 + r[0]%16, r[1], r[2] | 1}) }),
		random(func(r [3]byte) netip.Addr { return netip.AddrFrom4([4]byte{192, 168, r[1], r[2] | 1}) }),
		random(func(r [3]byte) netip.Addr { return netip.AddrFrom4([4]byte{100, 64 + r[0]%64, r[1], r[2] | 1}) }),
		random(func(r [3]byte) netip.Addr { return netip.AddrFrom16([16]byte{0xfd, 0xe9, r[0], r[1], 14: r[2], 15: 1}) }),
	}
	h := testenv.NewTestHost(t, private...)
	// One port for every listener on the test host.
	first := &countingListener{Listener: h.Listen(t, "tcp", ":0")}
	port := first.Addr().(*net.TCPAddr).Port //nolint:forcetypeassert // TCP.
	serve := func(l net.Listener) {
		srv := &http.Server{Handler: http.HandlerFunc(upstream), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	serve(first)
	listeners := map[netip.Addr]*countingListener{}
	for _, a := range private {
		l := &countingListener{Listener: h.Listen(t, "tcp", net.JoinHostPort(a.String(), strconv.Itoa(port)))}
		serve(l)
		listeners[a] = l
	}
	// The proxy host's own loopback, on the same port.
	for _, a := range []string{"127.0.0.1", "::1"} {
		ln, err := net.Listen("tcp", net.JoinHostPort(a, strconv.Itoa(port)))
		if err != nil {
			t.Logf("cannot listen on %s:%d (%v); relying on Squid's 403", a, port, err)
			continue
		}
		l := &countingListener{Listener: ln}
		serve(l)
		listeners[netip.MustParseAddr(a)] = l
	}

	names := map[string][]string{
		"loop.test":      {"127.0.0.1"},
		"loop6.test":     {"::1"},
		"meta.test":      {"169.254.169.254"},
		"azure.test":     {"168.63.129.16"},
		"private.test":   {private[0].String()},
		"ula.test":       {private[4].String()},
		"nat64loop.test": {"64:ff9b::7f00:1"},
		// One good address and one bad: denied, since Squid may use either.
		"mixed.test": {h.Addr.String(), private[1].String()},
	}
	up := startUpstreams(t, names)
	o := up.options(helper)
	at := func(host string) string { return net.JoinHostPort(host, strconv.Itoa(port)) }
	settings := proxy.Settings{AllowedClientCIDRs: []string{"127.0.0.0/8"}, AllowedPorts: []int32{int32(port), up.plainPort}} //nolint:gosec // a port.

	denied := []string{
		// The proxy host itself, in every spelling a URL allows.
		"127.0.0.1", "::1", "::ffff:127.0.0.1", "::ffff:7f00:1", "0.0.0.0", "::", "127.0.0.2", "64:ff9b::7f00:1", "2002:7f00:1::1", "::127.0.0.1",
		// Link-local and the clouds' metadata services.
		"169.254.169.254", "169.254.170.2", "fe80::1", "fd00:ec2::254", "fd00:ec2::23", "fd20:ce::254", "100.100.100.200", "168.63.129.16", "192.0.0.192",
		"64:ff9b::a9fe:a9fe",
		// Multicast and broadcast.
		"224.0.0.1", "255.255.255.255", "ff02::1",
		// Private ranges, each with a listener behind it.
		private[0].String(), private[1].String(), private[2].String(), private[3].String(), private[4].String(),
		// Names that resolve into them.
		"loop.test", "loop6.test", "meta.test", "azure.test", "private.test", "ula.test", "nat64loop.test", "mixed.test",
	}

	t.Run("denied by default", func(t *testing.T) {
		sq := startSquid(t, bin, settings, o)
		c := client{proxy: &url.URL{Scheme: "http", Host: sq.addr}}
		for _, d := range denied {
			expect(t, "GET http://"+at(d), c.get(t, "http://"+at(d)+"/"), http.StatusForbidden)
			expect(t, "CONNECT "+at(d), c.get(t, "https://"+at(d)+"/"), http.StatusForbidden)
		}
		// The control: a destination where a real one would stand works.
		expect(t, "the test host", c.get(t, "http://"+at(h.Addr.String())+"/"), http.StatusOK)
		expect(t, "the test host by name", c.get(t, "http://"+net.JoinHostPort("upstream.test", strconv.Itoa(int(up.plainPort)))+"/"), http.StatusOK)
		for a, l := range listeners {
			if n := l.n.Load(); n != 0 {
				t.Errorf("%s was connected to %d times through the proxy, want never", a, n)
			}
		}
		log, _ := os.ReadFile(sq.log)
		for _, d := range []string{"169.254.169.254", "168.63.129.16", "100.100.100.200", "fd00:ec2::254"} {
			if !strings.Contains(string(log), "TCP_DENIED/403") || !strings.Contains(string(log), d) {
				t.Errorf("Squid's access log has no TCP_DENIED/403 for %s", d)
			}
		}
	})

	t.Run("the proxy's own port", func(t *testing.T) {
		// Whatever the address (one of its own that no list knows: a NAT,
		// a load balancer), a request to the proxy's port is refused.
		sq := startSquid(t, bin, settings, o)
		_, own, _ := net.SplitHostPort(sq.addr)
		c := client{proxy: &url.URL{Scheme: "http", Host: sq.addr}}
		ownAt := net.JoinHostPort(h.Addr.String(), own)
		expect(t, "CONNECT to the proxy's port", c.get(t, "https://"+ownAt+"/"), http.StatusForbidden)
		expect(t, "GET to the proxy's port", c.get(t, "http://"+ownAt+"/"), http.StatusForbidden)
		expect(t, "CONNECT to the proxy itself", c.get(t, "https://"+sq.addr+"/"), http.StatusForbidden)
	})

	t.Run("the proxy host's own addresses", func(t *testing.T) {
		// As a VM lists them at boot (cloudinit): denied even inside a
		// range the resource opened.
		own := filepath.Join(worldReadableDir(t), "own-addresses")
		writeReadable(t, own, "acl own_dst dst 127.0.0.1\nacl own_dst dst ::1\nacl own_dst dst "+private[2].String()+"\n")
		o2 := o
		o2.OwnAddressesFile = own
		s := settings
		s.AllowedDestinationCIDRs = []string{"192.168.0.0/16", private[0].String() + "/32"}
		sq := startSquid(t, bin, s, o2)
		c := client{proxy: &url.URL{Scheme: "http", Host: sq.addr}}
		expect(t, "an own address in an opened range", c.get(t, "http://"+at(private[2].String())+"/"), http.StatusForbidden)
		expect(t, "another opened address", c.get(t, "http://"+at(private[0].String())+"/"), http.StatusOK)
		if n := listeners[private[2]].n.Load(); n != 0 {
			t.Errorf("the own address was connected to %d times", n)
		}
	})

	t.Run("opened deliberately", func(t *testing.T) {
		s := settings
		s.AllowedDestinationCIDRs = []string{private[0].String() + "/32", "fc00::/7"}
		// Names of several addresses come from DNS: Squid keeps one address
		// per name of its hosts_file.
		o := o
		o.DNSNameservers = []string{serveDNS(t, map[string][]string{
			"halfopen.test.":   {private[0].String(), private[1].String()},
			"halfopen64.test.": {private[0].String(), nat64(private[2])},
			"openedpub.test.":  {h.Addr.String(), private[0].String()},
		})}
		sq := startSquid(t, bin, s, o)
		c := client{proxy: &url.URL{Scheme: "http", Host: sq.addr}}
		expect(t, "opened private address", c.get(t, "http://"+at(private[0].String())+"/"), http.StatusOK)
		expect(t, "opened private address by name", c.get(t, "http://"+at("private.test")+"/"), http.StatusOK)
		expect(t, "opened ULA", c.get(t, "http://"+at(private[4].String())+"/"), http.StatusOK)
		expect(t, "a name resolving to an opened and a public address", c.get(t, "http://"+at("openedpub.test")+"/"), http.StatusOK)
		// A name resolving to an opened and an unopened address is refused
		// whole: Squid would try either.
		expect(t, "a name resolving to an opened and an unopened address", c.get(t, "http://"+at("halfopen.test")+"/"), http.StatusForbidden)
		expect(t, "a name resolving to an opened address and an unopened NAT64 one", c.get(t, "http://"+at("halfopen64.test")+"/"), http.StatusForbidden)
		if n := listeners[private[1]].n.Load(); n != 0 {
			t.Errorf("the unopened address %s was connected to %d times", private[1], n)
		}
		// What was not opened stays denied, and what is never opened too,
		// also inside an opened range (fd00:ec2::254 in fc00::/7).
		for _, d := range []string{private[1].String(), private[2].String(), "127.0.0.1", "169.254.169.254", "fd00:ec2::254", "fd20:ce::254", "meta.test", "loop.test"} {
			expect(t, "still denied "+d, c.get(t, "http://"+at(d)+"/"), http.StatusForbidden)
		}
		// A backend's own networks (a cluster's) cannot be opened.
		o2 := o
		o2.DeniedDestinationCIDRs = []string{private[0].String()}
		sq2 := startSquid(t, bin, s, o2)
		expect(t, "a backend's network, opened by the resource", client{proxy: &url.URL{Scheme: "http", Host: sq2.addr}}.get(t, "http://"+at(private[0].String())+"/"), http.StatusForbidden)
	})
}
