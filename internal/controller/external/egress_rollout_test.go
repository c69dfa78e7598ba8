package external

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestARolloutBehindTheServiceKeepsTheEgressAddress: a PodProxy behind a
// Service rolls out (the same Service address and backend figure,
// another pod): the address it was verified with stays published while
// a check runs, and when one fails.
func TestARolloutBehindTheServiceKeepsTheEgressAddress(t *testing.T) {
	for _, fail := range []bool{false, true} {
		running := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.96.0.10", ProxyReachable: true, ProxyAddress: "10.96.0.10:3128",
			Details: map[string]string{"pod": "proxy-7d9f-abcde"}}
		rolled := running
		rolled.Details = map[string]string{"pod": "proxy-5c8b-fghij"}
		e := newExternal(egressKind(), nil, nil)
		e.hints = newRetryHints(0)
		slow := make(chan struct{})
		var n atomic.Int32
		e.egress = &squid.EgressChecker{Wait: 10 * time.Millisecond, Timeout: 3 * time.Second, Ask: func(_ context.Context, addr string, _ proxy.EgressCheck) (string, error) {
			if n.Add(1) > 1 {
				if fail {
					return "", errors.New("echo: 503")
				}
				<-slow
			}
			return "203.0.113.7", nil
		}}
		cr := proxyResource()
		observe := func(inst proxy.Instance) { t.Helper(); observeEgress(t, e, cr, inst) }
		observe(running)
		for i := 0; cr.Status.AtProvider.EgressIP == "" && i < 100; i++ {
			time.Sleep(10 * time.Millisecond)
			observe(running)
		}
		if cr.Status.AtProvider.EgressIP != "203.0.113.7" {
			t.Fatalf("first check: %q", cr.Status.AtProvider.EgressIP)
		}
		observe(rolled)
		time.Sleep(50 * time.Millisecond)
		observe(rolled)
		if got := cr.Status.AtProvider.EgressIP; got != "203.0.113.7" {
			t.Errorf("fail=%v: after a rollout (same Service address), egressIP %q; want 203.0.113.7 kept", fail, got)
		}
		close(slow)
	}
}
