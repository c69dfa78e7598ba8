package testenv

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestNet is where test hosts stand: 198.18.0.0/15, reserved for
// benchmarking (RFC 2544). It is neither private nor routed on the
// internet, so the proxy's default denials (loopback, private ranges,
// link-local) leave it reachable, as a real destination would be, while no
// test traffic ever leaves this machine.
var TestNet = netip.MustParsePrefix("198.18.0.0/15")

// TestHost is a host of a test's own: a network namespace joined to this
// machine by a veth pair, with Addr (in TestNet) inside it and a route to
// it from here. It goes away when the test ends.
type TestHost struct {
	// Addr is the host's address, reachable from this machine.
	Addr netip.Addr
	// Netns is the namespace's name (ip netns).
	Netns string
	// Gateway is this machine's end of the veth pair, as the host sees it.
	Gateway netip.Addr

	nsFile string
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
	if _, err := exec.LookPath("ip"); err != nil {
		unavailable(t, "iproute2's ip is not installed (apt-get install iproute2)")
	}
	// Slots are /30s of TestNet; a free one is claimed by creating its
	// namespace, which fails when it exists (another test, another
	// process, or a leftover of a killed run).
	slots := uint32(1) << (32 - TestNet.Bits() - 2)
	base := binary.BigEndian.Uint32(TestNet.Addr().AsSlice())
	var h *TestHost
	var lastErr error
	for range 32 {
		var r [4]byte
		_, _ = rand.Read(r[:])
		slot := binary.BigEndian.Uint32(r[:]) % slots
		name := fmt.Sprintf("epx%05x", slot)
		out, err := exec.Command("ip", "netns", "add", name).CombinedOutput()
		if err != nil {
			lastErr = fmt.Errorf("ip netns add %s: %w: %s", name, err, strings.TrimSpace(string(out)))
			if strings.Contains(string(out), "File exists") {
				continue
			}
			break
		}
		addr := func(n uint32) netip.Addr {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], base+slot*4+n)
			return netip.AddrFrom4(b)
		}
		h = &TestHost{Addr: addr(2), Gateway: addr(1), Netns: name, nsFile: "/run/netns/" + name}
		break
	}
	if h == nil {
		unavailable(t, fmt.Sprintf("cannot create a network namespace for a test host: %v", lastErr))
	}
	t.Cleanup(func() {
		// Deleting the namespace removes the veth pair with it (once no
		// socket holds the namespace); the host-side routes go with the
		// veth.
		_ = exec.Command("ip", "netns", "del", h.Netns).Run()
	})
	outer, inner := h.Netns+"o", h.Netns+"i"
	cmds := [][]string{
		{"ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", h.Netns},
		{"ip", "addr", "add", h.Gateway.String() + "/30", "dev", outer},
		{"ip", "link", "set", outer, "up"},
		{"ip", "-n", h.Netns, "addr", "add", h.Addr.String() + "/30", "dev", inner},
		{"ip", "-n", h.Netns, "link", "set", inner, "up"},
		{"ip", "-n", h.Netns, "link", "set", "lo", "up"},
		{"ip", "-n", h.Netns, "route", "add", "default", "via", h.Gateway.String()},
	}
	v6 := false
	for _, a := range extra {
		if a.Is4() {
			cmds = append(cmds,
				[]string{"ip", "-n", h.Netns, "addr", "add", a.String() + "/32", "dev", "lo"},
				[]string{"ip", "route", "add", a.String() + "/32", "dev", outer, "via", h.Addr.String()})
			continue
		}
		if !v6 {
			// IPv6 needs its own link addresses on the pair.
			v6 = true
			cmds = append(cmds,
				[]string{"ip", "-n", h.Netns, "-6", "addr", "add", h.v6(2) + "/126", "dev", inner, "nodad"},
				[]string{"ip", "-6", "addr", "add", h.v6(1) + "/126", "dev", outer, "nodad"},
				[]string{"ip", "-n", h.Netns, "-6", "route", "add", "default", "via", h.v6(1), "dev", inner})
		}
		cmds = append(cmds,
			[]string{"ip", "-n", h.Netns, "-6", "addr", "add", a.String() + "/128", "dev", "lo", "nodad"},
			[]string{"ip", "-6", "route", "add", a.String() + "/128", "via", h.v6(2), "dev", outer})
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil { //nolint:gosec // fixed commands.
			unavailable(t, fmt.Sprintf("setting up test host %s: %s: %v: %s", h.Netns, strings.Join(c, " "), err, strings.TrimSpace(string(out))))
		}
	}
	return h
}

// v6 is an address of the veth pair's IPv6 link net, derived from the
// slot (in 2001:db8::/32, documentation space: never routed).
func (h *TestHost) v6(n byte) string {
	b := h.Addr.As4()
	return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xe9, 0x0, b[0], b[1], 0, 0, 0, 0, b[2], b[3] &^ 3, 0, n}).String()
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
// an empty host means Addr). The listener belongs to the namespace for its
// whole life: it is created there, and this process serves it from here.
func (h *TestHost) Listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	if host == "" {
		host = h.Addr.String()
	}
	var l net.Listener
	if err := h.do(func() error {
		var err error
		l, err = net.Listen(network, net.JoinHostPort(host, port))
		return err
	}); err != nil {
		t.Fatalf("listening in test host %s on %s: %v", h.Netns, addr, err)
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

// do runs f on an OS thread that has joined the host's namespace, so the
// sockets f creates live there. The thread goes back to this machine's
// namespace afterwards; if it cannot, it is never unlocked, so Go retires
// it instead of running other goroutines in the wrong namespace.
func (h *TestHost) do(f func() error) error {
	ns, err := os.Open(h.nsFile)
	if err != nil {
		return err
	}
	defer ns.Close()
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns: %w", err)
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return errors.Join(ferr, fmt.Errorf("returning to this machine's namespace: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// UpstreamBody is what Upstream answers.
const UpstreamBody = "hello from upstream"

// Upstream serves UpstreamBody over HTTP on a test host of t's own (see
// NewTestHost), where a real destination would stand: not loopback, not a
// private range, not this machine's own address, all of which the
// provider's squid.conf denies. It returns the URL and the port.
func Upstream(t testing.TB) (string, int) {
	t.Helper()
	h := NewTestHost(t)
	ap := h.Serve(t, ":0", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, UpstreamBody)
	}))
	return "http://" + ap.String() + "/", int(ap.Port())
}
