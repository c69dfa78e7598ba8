package netguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

type networks []netip.Prefix

func (n networks) Networks(context.Context) []netip.Prefix { return n }

// resolver answers from a table, and counts lookups.
type resolver map[string][]string

func (r resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	as, ok := r[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	out := make([]netip.Addr, len(as))
	for i, a := range as {
		out[i] = netip.MustParseAddr(a)
	}
	return out, nil
}

func mustPrefixes(t *testing.T, s ...string) []netip.Prefix {
	t.Helper()
	ps, err := ParseCIDRs("test", s)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// TestCheckEverySpelling: every address of the provider's own position is
// refused in every way an address can be written; a public one and the
// tenant's private networks are not.
func TestCheckEverySpelling(t *testing.T) {
	g := New(Options{
		Cluster: networks(mustPrefixes(t, "10.96.0.0/12", "10.244.0.0/16", "192.168.49.2", "fd10::/108")),
		Denied:  mustPrefixes(t, "172.31.0.0/16"),
	})
	cases := []struct {
		addr string
		why  string // "" allowed
	}{
		// loopback and unspecified
		{"127.0.0.1", whyLocal},
		{"127.1.2.3", whyLocal},
		{"0.0.0.0", whyLocal},
		{"0.1.2.3", whyLocal},
		{"::1", whyLocal},
		{"::", whyLocal},
		{"::ffff:127.0.0.1", whyLocal},
		{"::127.0.0.1", whyLocal},        // IPv4-compatible
		{"64:ff9b::7f00:1", whyLocal},    // NAT64
		{"64:ff9b::127.0.0.1", whyLocal}, // NAT64, dotted
		{"2002:7f00:1::", whyLocal},      // 6to4
		{"2002:7f00:1:ffff::1", whyLocal},
		{"64:ff9b:1::7f00:1", whyLocal},                    // local-use NAT64: refused whole
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", whyLocal}, // Teredo
		// link-local and metadata
		{"169.254.169.254", whyLocal},
		{"169.254.0.1", whyLocal},
		{"::ffff:169.254.169.254", whyLocal},
		{"::ffff:a9fe:a9fe", whyLocal},
		{"64:ff9b::a9fe:a9fe", whyLocal},
		{"2002:a9fe:a9fe::1", whyLocal},
		{"fe80::1", whyLocal},
		{"fe80::1%eth0", whyLocal},
		{"fec0::1", whyLocal},
		{"fd00:ec2::254", whyLocal},
		{"fd00:ec2::23", whyLocal},
		{"fd20:ce::254", whyLocal},
		{"100.100.100.200", whyLocal},
		{"64:ff9b::6464:64c8", whyLocal},
		{"192.0.0.192", whyLocal},
		{"168.63.129.16", whyLocal},
		// multicast, reserved, broadcast
		{"224.0.0.1", whyLocal},
		{"239.255.255.250", whyLocal},
		{"240.0.0.1", whyLocal},
		{"255.255.255.255", whyLocal},
		{"ff02::1", whyLocal},
		{"::ffff:224.0.0.1", whyLocal},
		{"2002:ffff:ffff::", whyLocal},
		// the cluster's own networks
		{"10.96.0.1", whyCluster},
		{"10.244.3.7", whyCluster},
		{"192.168.49.2", whyCluster},
		{"::ffff:10.96.0.10", whyCluster},
		{"64:ff9b::a60:1", whyCluster},
		{"2002:a60:1::", whyCluster},
		{"fd10::5", whyCluster},
		// the platform team's own denials
		{"172.31.4.4", whyDenied},
		{"::ffff:172.31.4.4", whyDenied},
		// what a tenant's hypervisor or cluster may well be
		{"10.20.0.5", ""},
		{"192.168.1.10", ""},
		{"192.168.49.3", ""},
		{"100.64.0.1", ""},
		{"8.8.8.8", ""},
		{"::ffff:8.8.8.8", ""},
		{"64:ff9b::808:808", ""},
		{"2001:db8::1", ""},
		{"fd00::1", ""},
	}
	for _, c := range cases {
		t.Run(c.addr, func(t *testing.T) {
			err := g.Check(context.Background(), netip.MustParseAddr(c.addr))
			if c.why == "" {
				if err != nil {
					t.Fatalf("Check(%s): %v, want allowed", c.addr, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("Check(%s): %v, want refused as %q", c.addr, err, c.why)
			}
			if proxy.ClassOf(err) != proxy.ClassPermanent || !IsRefused(err) {
				t.Errorf("Check(%s): class %s, IsRefused %t; want Permanent, true", c.addr, proxy.ClassOf(err), IsRefused(err))
			}
		})
	}
}

// TestAllowedRanges: the platform team's ranges open what they hold,
// except a more specific denial inside them: a metadata address opens only
// by naming it, a cluster network only by a range inside it.
func TestAllowedRanges(t *testing.T) {
	g := New(Options{
		Allowed: mustPrefixes(t, "127.0.0.0/8", "::1", "10.0.0.0/8", "169.254.0.0/16", "10.244.5.0/24", "100.100.100.200"),
		Cluster: networks(mustPrefixes(t, "10.244.0.0/16", "127.0.0.5")),
	})
	cases := map[string]bool{ // address: allowed
		"127.0.0.1":        true,
		"::ffff:127.0.0.1": true,
		"::1":              true,
		"10.1.2.3":         true,
		"169.254.10.10":    true,
		"169.254.169.254":  false, // metadata: not opened by 169.254.0.0/16
		"100.100.100.200":  true,  // named exactly
		"10.244.3.3":       false, // cluster network, more specific than 10.0.0.0/8
		"10.244.5.9":       true,  // the platform opened this part of it
		"127.0.0.5":        false, // a node address inside an allowed loopback
		"0.0.0.0":          false,
		"224.0.0.1":        false,
	}
	for a, want := range cases {
		err := g.Check(context.Background(), netip.MustParseAddr(a))
		if (err == nil) != want {
			t.Errorf("Check(%s) = %v, want allowed %t", a, err, want)
		}
	}
}

// TestCheckHostNames: names that mean the host itself are refused before
// any lookup; a name is refused when any of its addresses is.
func TestCheckHostNames(t *testing.T) {
	r := resolver{
		"pve.example":     {"192.0.2.10"},
		"mixed.example":   {"192.0.2.10", "127.0.0.1"},
		"mapped.example":  {"::ffff:169.254.169.254"},
		"cluster.example": {"10.96.0.1"},
	}
	g := New(Options{Resolver: r, Cluster: networks(mustPrefixes(t, "10.96.0.0/12"))})
	for _, h := range []string{"localhost", "LOCALHOST", "localhost.", "a.b.localhost", "ip6-localhost", "ip6-loopback", "localhost6", "metadata.google.internal", "metadata.google.internal.", "mixed.example", "mapped.example", "cluster.example", "[::1]", "127.0.0.1", "[::ffff:127.0.0.1]"} {
		if _, err := g.CheckHost(context.Background(), h); err == nil || !IsRefused(err) {
			t.Errorf("CheckHost(%s) = %v, want refused", h, err)
		} else if strings.Contains(err.Error(), "10.96.0.1") || strings.Contains(err.Error(), "169.254.169.254") || strings.Contains(err.Error(), "192.0.2.10") {
			t.Errorf("CheckHost(%s): %v quotes what the name resolved to", h, err)
		}
	}
	if as, err := g.CheckHost(context.Background(), "pve.example"); err != nil || len(as) != 1 {
		t.Errorf("CheckHost(pve.example) = %v, %v; want its address", as, err)
	}
	if _, err := (*Guard)(nil).CheckHost(context.Background(), "localhost"); err != nil {
		t.Errorf("a nil Guard refused: %v", err)
	}
}

// counting is a listener that counts the connections it accepts.
type counting struct {
	net.Listener
	n atomic.Int32
}

func listen(t *testing.T, addr string) *counting {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &counting{Listener: l}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			c.n.Add(1)
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() { _ = l.Close() })
	return c
}

// TestDialRefusesLoopback: the dial of a refused address (or a name for
// one) never reaches the listener; an allowed one does.
func TestDialRefusesLoopback(t *testing.T) {
	l := listen(t, "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(l.Addr().String())
	r := resolver{"rebind.example": {"127.0.0.1"}, "ok.example": {"127.0.0.1"}}
	g := New(Options{Resolver: r})
	for _, host := range []string{"127.0.0.1", "localhost", "rebind.example", "::ffff:127.0.0.1", "127.0.0.1."} {
		if c, err := g.DialContext(context.Background(), "tcp", net.JoinHostPort(host, port)); err == nil {
			_ = c.Close()
			t.Errorf("dial %s connected", host)
		}
	}
	if n := l.n.Load(); n != 0 {
		t.Fatalf("the loopback listener accepted %d connections, want 0", n)
	}

	open := New(Options{Resolver: r, Allowed: mustPrefixes(t, "127.0.0.1")})
	c, err := open.DialContext(context.Background(), "tcp", net.JoinHostPort("ok.example", port))
	if err != nil {
		t.Fatalf("dial through an allowed range: %v", err)
	}
	_ = c.Close()
}

// TestControlChecksTheSocket: the address a socket connects to is checked
// even when the lookup answered an allowed one (the last line against a
// resolver that answers differently the second time).
func TestControlChecksTheSocket(t *testing.T) {
	g := New(Options{})
	err := g.control(context.Background())("tcp4", "127.0.0.1:22", nil)
	if !IsRefused(err) {
		t.Fatalf("control(127.0.0.1:22) = %v, want refused", err)
	}
	if err := g.control(context.Background())("tcp4", "192.0.2.1:22", nil); err != nil {
		t.Fatalf("control(192.0.2.1:22) = %v", err)
	}
}

// TestRedirectToLoopbackRefused: a server the tenant may name redirects to
// loopback; the client follows no such redirect and the loopback server
// sees nothing.
func TestRedirectToLoopbackRefused(t *testing.T) {
	var hits atomic.Int32
	inner := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "secret")
	}))
	inner.Listener = listen(t, "127.0.0.1:0").Listener
	inner.Start()
	defer inner.Close()
	outer := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, inner.URL+"/x", http.StatusFound)
	}))
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	outer.Listener = l
	outer.Start()
	defer outer.Close()

	g := New(Options{Allowed: mustPrefixes(t, "127.0.0.2")})
	c := &http.Client{Transport: g.Transport(&http.Transport{}), CheckRedirect: g.CheckRedirect}
	resp, err := c.Get(outer.URL)
	if err == nil {
		_ = resp.Body.Close()
		t.Fatal("the redirect to loopback was followed")
	}
	if !IsRefused(err) {
		t.Errorf("error %v, want a refusal", err)
	}
	// Without CheckRedirect, the dial refuses it as well.
	c.CheckRedirect = nil
	if resp, err := c.Get(outer.URL); err == nil {
		_ = resp.Body.Close()
		t.Fatal("the redirect to loopback was dialled")
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the loopback server answered %d requests, want 0", n)
	}
}

// TestThroughAProxy: with a proxy in the environment, the target is
// checked before the request is handed to the proxy, which the guard
// dials as the platform team set it.
func TestThroughAProxy(t *testing.T) {
	var seen atomic.Int32
	var asked atomic.Value
	p := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		asked.Store(r.URL.String())
		_, _ = io.WriteString(w, "via proxy")
	}))
	l, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	p.Listener = l
	p.Start()
	defer p.Close()
	pu, _ := url.Parse(p.URL)

	g := New(Options{Resolver: resolver{"pve.example": {"192.0.2.10"}, "inside.example": {"10.96.0.1"}}, Cluster: networks(mustPrefixes(t, "10.96.0.0/12"))})
	c := &http.Client{Transport: g.Transport(&http.Transport{Proxy: http.ProxyURL(pu)})}
	for _, target := range []string{"http://127.0.0.1:9/", "http://inside.example/", "http://[::1]/", "http://169.254.169.254/latest/meta-data/"} {
		if resp, err := c.Get(target); err == nil {
			_ = resp.Body.Close()
			t.Errorf("GET %s through the proxy: sent", target)
		} else if !IsRefused(err) {
			t.Errorf("GET %s: %v, want a refusal", target, err)
		}
	}
	if n := seen.Load(); n != 0 {
		t.Fatalf("the proxy was asked %d times for refused targets", n)
	}
	resp, err := c.Get("http://pve.example/api2/json/version")
	if err != nil {
		t.Fatalf("GET through the proxy: %v", err)
	}
	_ = resp.Body.Close()
	if got := fmt.Sprint(asked.Load()); got != "http://pve.example/api2/json/version" {
		t.Errorf("the proxy was asked for %s", got)
	}
}

func TestParseCIDRs(t *testing.T) {
	ps, err := ParseCIDRs("--tenant-endpoint-allowed-cidrs", []string{"10.0.0.0/8", " 192.0.2.1 ", "::ffff:10.0.0.0/104", "", "fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	want := "[10.0.0.0/8 192.0.2.1/32 10.0.0.0/8 fd00::/8]"
	if got := fmt.Sprint(ps); got != want {
		t.Errorf("ParseCIDRs = %s, want %s", got, want)
	}
	if _, err := ParseCIDRs("--tenant-endpoint-allowed-cidrs", []string{"10.0.0.0/33"}); err == nil || !strings.Contains(err.Error(), "--tenant-endpoint-allowed-cidrs") {
		t.Errorf("ParseCIDRs(10.0.0.0/33) = %v, want an error naming the flag", err)
	}
}

func TestNilGuard(t *testing.T) {
	var g *Guard
	if err := g.Check(context.Background(), netip.MustParseAddr("127.0.0.1")); err != nil {
		t.Error(err)
	}
	l := listen(t, "127.0.0.1:0")
	c, err := g.DialContext(context.Background(), "tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if errors.Is(err, context.Canceled) {
		t.Fatal()
	}
}
