package netguard

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
)

// TestForContentDropsAllowedRanges: the guard of content downloads
// refuses what the platform team allows for tenants' endpoints (a range
// inside the cluster's networks, a denied range, loopback), in every
// spelling and for names resolving there, while the guard it came from
// still allows it; what no guard refuses stays allowed; and nil stays nil.
func TestForContentDropsAllowedRanges(t *testing.T) {
	ctx := context.Background()
	g := New(Options{
		Allowed:  mustPrefixes(t, "10.244.7.0/24", "172.31.5.0/24", "127.0.0.0/8"),
		Denied:   mustPrefixes(t, "172.31.0.0/16"),
		Cluster:  networks(mustPrefixes(t, "10.244.0.0/16")),
		Resolver: resolver{"pve.internal.example": {"10.244.7.9"}, "mirror.example": {"151.101.2.132"}},
	})
	content := g.ForContent()
	if content == nil || content == g {
		t.Fatalf("ForContent = %p of %p; want a copy", content, g)
	}
	for _, a := range []string{"10.244.7.9", "::ffff:10.244.7.9", "172.31.5.1", "127.0.0.1"} {
		addr := netip.MustParseAddr(a)
		if err := g.Check(ctx, addr); err != nil {
			t.Errorf("the endpoints' guard refuses %s inside an allowed range: %v", a, err)
		}
		if err := content.Check(ctx, addr); !IsRefused(err) {
			t.Errorf("the content guard's Check(%s) = %v; want refused", a, err)
		}
	}
	if _, err := g.CheckHost(ctx, "pve.internal.example"); err != nil {
		t.Errorf("the endpoints' guard refuses a name in an allowed range: %v", err)
	}
	if _, err := content.CheckHost(ctx, "pve.internal.example"); !IsRefused(err) {
		t.Errorf("the content guard's CheckHost of a name in an allowed range = %v; want refused", err)
	}
	if _, err := content.CheckHost(ctx, "mirror.example"); err != nil {
		t.Errorf("the content guard refuses a public name: %v", err)
	}
	// The original keeps its ranges: ForContent copies.
	if err := g.Check(ctx, netip.MustParseAddr("10.244.7.9")); err != nil {
		t.Errorf("after ForContent the endpoints' guard refuses an allowed address: %v", err)
	}

	// A connection into an allowed range is never made.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	if c, err := g.DialContext(ctx, "tcp", ln.Addr().String()); err != nil {
		t.Errorf("the endpoints' guard does not dial an allowed loopback address: %v", err)
	} else {
		_ = c.Close()
	}
	if c, err := content.DialContext(ctx, "tcp", ln.Addr().String()); !IsRefused(err) {
		if c != nil {
			_ = c.Close()
		}
		t.Errorf("the content guard's dial of an allowed loopback address = %v; want refused", err)
	}

	var none *Guard
	if none.ForContent() != nil {
		t.Error("ForContent of nil is not nil")
	}
}

// TestTenantDownloadsReadOnlyPublicAddresses: a tenant's download (an
// image whose bytes land where the tenant reads them) is refused at any
// address that is not public, in every spelling and by name, though every
// cluster network is known and the endpoints' guard lets the address
// through; public addresses, in any spelling, download. The platform
// team's content ranges open a private mirror, never the cluster's
// networks inside them.
func TestTenantDownloadsReadOnlyPublicAddresses(t *testing.T) {
	ctx := context.Background()
	cluster := networks(mustPrefixes(t, "10.96.0.0/12", "10.244.0.0/16", "10.0.1.5/32"))
	res := resolver{"intranet.corp.example": {"151.101.2.132", "10.50.1.1"}, "mirror.example": {"151.101.2.132", "2a04:4e42::132"}}
	g := New(Options{Cluster: cluster, Resolver: res})
	content := g.ForContent()
	for _, a := range []string{
		"10.50.1.1", "10.0.1.6", "172.20.3.4", "192.168.7.1", "100.64.1.1", "192.0.0.8", "192.0.2.1",
		"198.18.0.1", "198.51.100.7", "203.0.113.9", "192.88.99.1", "fd12::1", "2001:db8::1", "3fff::1", "100::1", "5f00::1",
		"::ffff:10.50.1.1", "64:ff9b::a32:101", "2002:a32:101::1", "64:ff9b::c612:1",
	} {
		addr := netip.MustParseAddr(a)
		err := content.Check(ctx, addr)
		if !IsRefused(err) || !strings.Contains(err.Error(), "not a public address") || !strings.Contains(err.Error(), "--tenant-content-allowed-cidrs") {
			t.Errorf("a tenant's download from %s: %v; want a refusal saying it is not public and naming --tenant-content-allowed-cidrs", a, err)
		}
	}
	if err := g.Check(ctx, netip.MustParseAddr("10.50.1.1")); err != nil {
		t.Errorf("the endpoints' guard refuses a private address outside the cluster: %v", err)
	}
	if _, err := content.CheckHost(ctx, "intranet.corp.example"); !IsRefused(err) || strings.Contains(err.Error(), "10.50.1.1") {
		t.Errorf("a tenant's download from a name resolving to a private address: %v; want a refusal naming no address", err)
	}
	for _, a := range []string{"151.101.2.132", "2a04:4e42::132", "::ffff:151.101.2.132", "64:ff9b::9765:284", "2002:9765:284::1"} {
		if err := content.Check(ctx, netip.MustParseAddr(a)); err != nil {
			t.Errorf("a tenant's download from public %s: %v", a, err)
		}
	}
	if _, err := content.CheckHost(ctx, "mirror.example"); err != nil {
		t.Errorf("a tenant's download from a public name: %v", err)
	}

	mirror := New(Options{Cluster: cluster, Resolver: res, ContentAllowed: mustPrefixes(t, "10.0.0.0/8")}).ForContent()
	if err := mirror.Check(ctx, netip.MustParseAddr("10.50.1.1")); err != nil {
		t.Errorf("a download from a range allowed for content: %v", err)
	}
	for _, a := range []string{"10.244.3.4", "10.96.0.10", "172.20.3.4", "127.0.0.1"} {
		if err := mirror.Check(ctx, netip.MustParseAddr(a)); !IsRefused(err) {
			t.Errorf("a download from %s, 10.0.0.0/8 allowed for content: %v; want refused", a, err)
		}
	}
	if err := New(Options{Cluster: cluster, ContentAllowed: mustPrefixes(t, "10.0.0.0/8")}).Check(ctx, netip.MustParseAddr("127.0.0.1")); !IsRefused(err) {
		t.Errorf("content ranges open an endpoint: %v", err)
	}
}
