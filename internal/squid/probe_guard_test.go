package squid

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// refuseAll is a tenant's guard that refuses every address.
type refuseAll struct{ checked atomic.Int32 }

func (g *refuseAll) CheckHost(context.Context, string) ([]netip.Addr, error) {
	g.checked.Add(1)
	return nil, errors.New("an address of the provider's own cluster")
}

func (g *refuseAll) DialContext(context.Context, string, string) (net.Conn, error) {
	g.checked.Add(1)
	return nil, errors.New("refused")
}

// TestProberTenantNotServedByAPlatformProbe: a tenant's backend that
// reports the key, address and mark of a platform proxy probed a moment
// ago is not Ready on that probe's result: its own guard is consulted and
// refuses the address.
func TestProberTenantNotServedByAPlatformProbe(t *testing.T) {
	const key, addr = "uid-of-platform-proxy/pod-uid", "10.244.1.7:3128"
	id := Identity("6f1c2a7e-3b4d-4c5e-9f60-718293a4b5c6")
	var asked atomic.Int32
	p := &Prober{Wait: time.Minute, Ask: func(context.Context, string) (string, error) { asked.Add(1); return id, nil }}
	if pr := p.Check(context.Background(), nil, key, addr, id, ""); !pr.Serving {
		t.Fatalf("platform probe: %+v", pr)
	}
	g := &refuseAll{}
	pr := p.Check(context.Background(), g, key, addr, id, "")
	if pr.Serving || !pr.Refused || g.checked.Load() == 0 {
		t.Errorf("tenant's check of %s: Serving=%v Refused=%v, guard consulted %d times; want Refused by its guard", addr, pr.Serving, pr.Refused, g.checked.Load())
	}
	if pr := p.Check(context.Background(), nil, key, addr, id, ""); !pr.Serving {
		t.Errorf("platform probe after the tenant's: %+v", pr)
	}
}
