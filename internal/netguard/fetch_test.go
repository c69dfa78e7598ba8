package netguard

import (
	"context"
	"net"
	"net/netip"
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
		Resolver: resolver{"pve.internal.example": {"10.244.7.9"}, "mirror.example": {"198.51.100.20"}},
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
