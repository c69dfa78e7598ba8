//go:build linux

package testenv

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// HostOnBridge is a test host: a network namespace of its own, created
// here, with one interface (eth0, addr) attached to bridge, such as the
// local node's pod network (controlplane.Node.Bridge and TestHostAddr). It
// is removed when t ends. Pods on the bridge reach it; nothing else does.
type HostOnBridge struct {
	// Netns is the network namespace's name (ip netns).
	Netns string
	// Addr is its address.
	Addr netip.Prefix
}

// NewHostOnBridge creates the test host (needs root).
func NewHostOnBridge(t testing.TB, bridge string, addr netip.Prefix) *HostOnBridge {
	t.Helper()
	id := strconv.Itoa(os.Getpid() % 100000)
	h := &HostOnBridge{Netns: "epxhost" + id, Addr: addr}
	veth := "vepxh" + id
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", h.Netns)
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "delete", h.Netns).Run() // takes the veth pair with it
		_ = exec.Command("ip", "link", "delete", veth).Run()
	})
	run("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", h.Netns)
	run("link", "set", veth, "master", bridge, "up")
	run("-n", h.Netns, "addr", "add", addr.String(), "dev", "eth0")
	run("-n", h.Netns, "link", "set", "eth0", "up")
	run("-n", h.Netns, "link", "set", "lo", "up")
	return h
}

// Listen opens a TCP listener inside the host's namespace (the socket
// stays there; the calling goroutine returns to its own namespace).
func (h *HostOnBridge) Listen(port int) (net.Listener, error) {
	var l net.Listener
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, e := os.Open("/proc/thread-self/ns/net")
		if e != nil {
			err = e
			return
		}
		defer orig.Close()
		target, e := os.Open("/run/netns/" + h.Netns)
		if e != nil {
			err = e
			return
		}
		defer target.Close()
		if e := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); e != nil { //nolint:gosec // a file descriptor fits.
			err = fmt.Errorf("setns %s: %w", h.Netns, e)
			return
		}
		l, err = net.Listen("tcp4", net.JoinHostPort(h.Addr.Addr().String(), strconv.Itoa(port)))
		if e := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); e != nil { //nolint:gosec // a file descriptor fits.
			// The thread stays locked and dies with this goroutine, so no
			// other goroutine runs in the wrong namespace.
			return
		}
		runtime.UnlockOSThread()
	}()
	<-done
	return l, err
}

// Upstream serves "hello from upstream" over HTTP from the host until t
// ends, and returns the URL and port.
func (h *HostOnBridge) Upstream(t testing.TB) (string, int) {
	t.Helper()
	l, err := h.Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello from upstream")
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String() + "/", l.Addr().(*net.TCPAddr).Port //nolint:forcetypeassert // a TCP listener.
}
