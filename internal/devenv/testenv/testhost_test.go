package testenv

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestTestHostIntegration proves a test host is reachable from this
// machine on its TestNet address and on extra addresses, and that what it
// serves is in its namespace, not on this machine.
func TestTestHostIntegration(t *testing.T) {
	extra := []netip.Addr{netip.MustParseAddr("10.254.17.3"), netip.MustParseAddr("fd00:e9::17:3")}
	h := NewTestHost(t, extra...)
	if !TestNet.Contains(h.Addr) {
		t.Fatalf("address %s outside %s", h.Addr, TestNet)
	}
	for _, a := range append([]netip.Addr{h.Addr}, extra...) {
		ap := h.Serve(t, net.JoinHostPort(a.String(), "0"), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "from "+a.String())
		}))
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + ap.String() + "/")
		if err != nil {
			t.Fatalf("GET %s: %v", ap, err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if string(b) != "from "+a.String() {
			t.Errorf("GET %s = %q", ap, b)
		}
	}
	// The listener is in the namespace: this machine has no such address.
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if strings.HasPrefix(a.String(), h.Addr.String()+"/") {
			t.Errorf("this machine has the test host's address %s", a)
		}
	}
	url, port := Upstream(t)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(b) != UpstreamBody || port == 0 {
		t.Errorf("Upstream %s answered %q", url, b)
	}
}
