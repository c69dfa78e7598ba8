// Package netnshost makes a host of its own on this machine: a network
// namespace joined to it by a veth pair, with an address in Net (reserved
// for benchmarking, never routed on the internet) and a route to it from
// here, where a real destination would stand. Tests use it through
// testenv.NewTestHost; `make run` serves its quickstart's upstream web
// page from one.
package netnshost

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/procid"
)

// Net is where hosts stand: 198.18.0.0/15, reserved for benchmarking (RFC
// 2544). It is neither private nor routed on the internet, so the proxy's
// default denials (loopback, private ranges, link-local) leave it
// reachable, as a real destination would be, while no traffic to it ever
// leaves this machine.
var Net = netip.MustParsePrefix("198.18.0.0/15")

// Host is a network namespace joined to this machine by a veth pair, with
// Addr (in Net) inside it and a route to it from here.
type Host struct {
	// Addr is the host's address, reachable from this machine.
	Addr netip.Addr
	// Netns is the namespace's name (ip netns).
	Netns string
	// Gateway is this machine's end of the veth pair, as the host sees it.
	Gateway netip.Addr

	nsFile  string
	servers []*http.Server
}

// Unrouted returns an address gen makes that no route of this machine
// covers but a default one, trying a few: for a test host's extra
// addresses, which New routes to it.
func Unrouted(gen func() netip.Addr) netip.Addr {
	a := gen()
	for range 64 {
		if routeOf(a) == "" {
			return a
		}
		a = gen()
	}
	return a
}

// routeOf is the route of this machine, other than a default one, that
// covers a (in any table: the local table holds its own addresses), or "".
func routeOf(a netip.Addr) string {
	family := "-4"
	if a.Is6() && !a.Is4In6() {
		family = "-6"
	}
	out, err := exec.Command("ip", family, "route", "show", "table", "all").Output()
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		if slices.Contains([]string{"local", "broadcast", "multicast", "unicast", "anycast", "blackhole", "unreachable", "prohibit", "throw"}, dst) && len(f) > 1 {
			dst = f[1]
		}
		if dst == "default" {
			continue
		}
		p, err := netip.ParsePrefix(dst)
		if err != nil {
			if b, err := netip.ParseAddr(dst); err == nil {
				p = netip.PrefixFrom(b, b.BitLen())
			} else {
				continue
			}
		}
		if p.Bits() > 0 && p.Contains(a.Unmap()) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// ErrUnavailable wraps what stops a host from being made here (no root,
// no iproute2).
var ErrUnavailable = errors.New("no network namespace host on this machine")

// New makes a host (root and iproute2 needed). extra are more addresses
// for it (a private one, say, to prove a proxy denies it), each routed to
// it from this machine as a /32 or /128; one on a network this machine
// routes already (its own, its LAN's) is refused, since the route would
// take that network's traffic: pick them with Unrouted. Close removes it.
func New(extra ...netip.Addr) (*Host, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("%w: iproute2's ip is not installed (apt-get install iproute2)", ErrUnavailable)
	}
	for _, a := range extra {
		if r := routeOf(a); r != "" {
			return nil, fmt.Errorf("address %s for a test host is on a network this machine routes (%s): choose another", a, r)
		}
	}
	// Slots are /30s of Net. A slot is taken only where this machine
	// routes neither of its addresses (a VPN's or a proxy's fake-IP TUN
	// routes 198.18.0.0/15, and the connected route of the pair would
	// take that traffic), and claimed by its record (claim, which fails
	// when another's is there) before its namespace is made, so that a
	// process killed in between leaves a namespace the next sweep finds.
	// Making the namespace fails when it exists (a namespace of that name
	// with no record, not this package's to touch).
	sweepLeftovers()
	slots := uint32(1) << (32 - Net.Bits() - 2)
	base := binary.BigEndian.Uint32(Net.Addr().AsSlice())
	var h *Host
	var lastErr error
	for range 32 {
		var r [4]byte
		_, _ = rand.Read(r[:])
		slot := binary.BigEndian.Uint32(r[:]) % slots
		name := fmt.Sprintf("epx%05x", slot)
		addr := func(n uint32) netip.Addr {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], base+slot*4+n)
			return netip.AddrFrom4(b)
		}
		if r := routedSlot(addr(1), addr(2)); r != "" {
			lastErr = fmt.Errorf("this machine routes %s/30 already (%s)", addr(0), r)
			continue
		}
		if err := claim(name); err != nil {
			lastErr = err
			if errors.Is(err, os.ErrExist) {
				continue
			}
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		out, err := exec.Command("ip", "netns", "add", name).CombinedOutput() //nolint:gosec // a name made here.
		if err != nil {
			_ = os.Remove(filepath.Join(ownersDir, name))
			lastErr = fmt.Errorf("ip netns add %s: %w: %s", name, err, strings.TrimSpace(string(out)))
			if strings.Contains(string(out), "File exists") {
				continue
			}
			break
		}
		h = &Host{Addr: addr(2), Gateway: addr(1), Netns: name, nsFile: "/run/netns/" + name}
		break
	}
	if h == nil {
		return nil, fmt.Errorf("%w: cannot create a network namespace: %w", ErrUnavailable, lastErr)
	}
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
			_ = h.Close()
			return nil, fmt.Errorf("setting up host %s: %s: %w: %s", h.Netns, strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return h, nil
}

// Close stops what Serve serves and deletes the namespace, which removes
// the veth pair with it (once no socket holds the namespace) and the
// routes to it.
func (h *Host) Close() error {
	for _, s := range h.servers {
		_ = s.Close()
	}
	return remove(h.Netns)
}

// remove deletes a namespace of this package's and its owner record.
func remove(name string) error {
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil { //nolint:gosec // our namespace.
		return fmt.Errorf("ip netns del %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	_ = os.Remove(filepath.Join(ownersDir, name))
	return nil
}

// ownersDir records which process made each namespace ("pid start-time"),
// so that one left by a process that died without Close (a killed test,
// a test binary's timeout) is removed by the next New on this machine.
// /run is a tmpfs: the records go with a reboot, as the namespaces do.
var ownersDir = "/run/egressproxy-netns"

// claim records this process as the owner of the namespace name, before
// the namespace is made. It fails (os.ErrExist) when a record of that
// name is there: another process's, which may be making it now.
func claim(name string) error {
	if err := os.MkdirAll(ownersDir, 0o700); err != nil {
		return fmt.Errorf("recording the owner of namespace %s: %w", name, err)
	}
	id, err := procid.Self()
	if err != nil {
		return fmt.Errorf("recording the owner of namespace %s: %w", name, err)
	}
	f, err := os.OpenFile(filepath.Join(ownersDir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600) //nolint:gosec // The project's own record, named after its namespace.
	if err != nil {
		return fmt.Errorf("recording the owner of namespace %s: %w", name, err)
	}
	_, err = f.WriteString(id)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(filepath.Join(ownersDir, name))
		return fmt.Errorf("recording the owner of namespace %s: %w", name, err)
	}
	return nil
}

// slotRouteOf is routeOf, for routedSlot (a test's stand-in replaces it).
var slotRouteOf = routeOf

// routedSlot is a route of this machine, other than a default one, that
// covers one of addrs (a slot's two addresses), or "".
func routedSlot(addrs ...netip.Addr) string {
	for _, a := range addrs {
		if r := slotRouteOf(a); r != "" {
			return r
		}
	}
	return ""
}

// sweepLeftovers removes the namespaces whose recorded owner no longer
// runs, and their records (a record is written before its namespace is
// made: one whose namespace is missing is removed alone). A namespace
// with no record is never touched: it is not this package's (or of a
// version that recorded its namespaces after making them).
func sweepLeftovers() {
	entries, err := os.ReadDir(ownersDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		rec, err := os.ReadFile(filepath.Join(ownersDir, e.Name()))
		if err != nil {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(string(rec), "%d", &pid); err != nil {
			continue // being written, or not a record of this package's
		}
		if procid.Running(string(rec)) {
			continue // its owner still runs
		}
		if _, err := os.Stat("/run/netns/" + e.Name()); errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(filepath.Join(ownersDir, e.Name()))
			continue
		}
		_ = remove(e.Name())
	}
}

// v6 is an address of the veth pair's IPv6 link net, derived from the
// slot (in 2001:db8::/32, documentation space: never routed).
func (h *Host) v6(n byte) string {
	b := h.Addr.As4()
	return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xe9, 0x0, b[0], b[1], 0, 0, 0, 0, b[2], b[3] &^ 3, 0, n}).String()
}

// Listen opens a listener inside the host's namespace, on addr (host:port;
// an empty host means Addr). The listener belongs to the namespace for its
// whole life: it is created there, and this process serves it from here.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
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
		return nil, fmt.Errorf("listening in host %s on %s: %w", h.Netns, addr, err)
	}
	return l, nil
}

// Serve serves handler over HTTP on a listener of Listen until Close, and
// returns the listener's address.
func (h *Host) Serve(addr string, handler http.Handler) (netip.AddrPort, error) {
	l, err := h.Listen("tcp", addr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	h.servers = append(h.servers, srv)
	go func() { _ = srv.Serve(l) }()
	return l.Addr().(*net.TCPAddr).AddrPort(), nil //nolint:forcetypeassert // a TCP listener.
}

// do runs f on an OS thread that has joined the host's namespace, so the
// sockets f creates live there. The thread goes back to this machine's
// namespace afterwards; if it cannot, it is never unlocked, so Go retires
// it instead of running other goroutines in the wrong namespace.
func (h *Host) do(f func() error) error {
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

// EchoPath is the path where the test servers on these hosts answer with
// the address a request came from (Echo): the echo endpoint of an egress
// check.
const EchoPath = "/ip"

// Echo answers with the address the request came from, as plain text and
// nothing else, as an echo endpoint (https://api.ipify.org) does: what
// a vendor allow-listing its clients would see of the caller.
func Echo(w http.ResponseWriter, r *http.Request) {
	from, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		http.Error(w, "cannot read the caller's address", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = fmt.Fprint(w, from.Addr().Unmap().String()) //nolint:gosec // an address, as plain text.
}
