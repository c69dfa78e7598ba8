package testenv

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/netnshost"
)

// TestNet is where test hosts stand: netnshost.Net, 198.18.0.0/15,
// reserved for benchmarking (RFC 2544). It is neither private nor routed
// on the internet, so the proxy's default denials (loopback, private
// ranges, link-local) leave it reachable, as a real destination would be,
// while no test traffic ever leaves this machine.
var TestNet = netnshost.Net

// TestHost is a host of a test's own (a netnshost.Host): a network
// namespace joined to this machine by a veth pair, with Addr (in TestNet)
// inside it and a route to it from here. It goes away when the test ends.
type TestHost struct {
	*netnshost.Host
}

// CI reports whether the tests run in CI (CI set to anything but "", "0"
// or "false"): an integration test that cannot get its component then fails
// instead of skipping.
func CI() bool {
	ci := os.Getenv("CI")
	return ci != "" && ci != "0" && ci != "false"
}

// NewTestHost creates a test host (root and iproute2 needed: make test runs
// as root and installs iproute2). extra are more addresses for the host
// (a private one, say, to prove a proxy denies it), each routed to it from
// this machine as a /32 or /128; leave the machine's own networks and
// well-known addresses out. Without the rights or the tools the test skips,
// or fails under CI.
func NewTestHost(t testing.TB, extra ...netip.Addr) *TestHost {
	t.Helper()
	h, err := netnshost.New(extra...)
	if err != nil {
		unavailable(t, err.Error())
	}
	t.Cleanup(func() { _ = h.Close() })
	return &TestHost{Host: h}
}

// unavailable skips t, or fails it under CI, where a missing test network
// must never pass as a skip.
func unavailable(t testing.TB, why string) {
	t.Helper()
	if CI() {
		t.Fatalf("%s (CI is set, so this test does not skip; make test runs as root with iproute2)", why)
	}
	t.Skip(why)
}

// Listen opens a listener inside the host's namespace, on addr (host:port;
// an empty host means Addr), closed when t ends.
func (h *TestHost) Listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	l, err := h.Host.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// Serve serves handler over HTTP on a listener of Listen until t ends, and
// returns the listener's address.
func (h *TestHost) Serve(t testing.TB, addr string, handler http.Handler) netip.AddrPort {
	t.Helper()
	l := h.Listen(t, "tcp", addr)
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().(*net.TCPAddr).AddrPort() //nolint:forcetypeassert // a TCP listener.
}

// UpstreamBody is what Upstream answers.
const UpstreamBody = "hello from upstream"

// Upstream serves UpstreamBody over HTTP on a test host of t's own (see
// NewTestHost), where a real destination would stand: not loopback, not a
// private range, not this machine's own address, all of which the
// provider's squid.conf denies. At netnshost.EchoPath (EchoURL) it answers
// with the address a request came from, as an egress check's echo
// endpoint. It returns the URL and the port.
func Upstream(t testing.TB) (string, int) {
	t.Helper()
	h := NewTestHost(t)
	ap := h.Serve(t, ":0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == netnshost.EchoPath {
			netnshost.Echo(w, r)
			return
		}
		_, _ = io.WriteString(w, UpstreamBody)
	}))
	return "http://" + ap.String() + "/", int(ap.Port())
}

// EchoURL is the echo endpoint of the Upstream at url: it answers with the
// address a request came from.
func EchoURL(url string) string {
	return strings.TrimSuffix(url, "/") + netnshost.EchoPath
}

// EchoFromHere is what the echo endpoint at echoURL (EchoURL) sees of a
// request from this machine without a proxy: the address a process here
// (a fake's guest Squid) reaches the test host from.
func EchoFromHere(t testing.TB, echoURL string) string {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}).Get(echoURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %s, %v", echoURL, resp.Status, err)
	}
	return strings.TrimSpace(string(body))
}
