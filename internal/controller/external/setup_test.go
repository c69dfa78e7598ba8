package external

import (
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
)

// TestPollHook: a Ready resource polls at the poll interval and one not
// Ready at the fast one, each with the configured jitter either way, but
// never more than a quarter of its interval: a jitter set for the slow
// polls spreads them, and leaves the fast ones fast.
func TestPollHook(t *testing.T) {
	ready := proxyResource(func(cr *nsproxy.KVMProxy) { cr.SetConditions(xpv2.Available()) })
	notReady := proxyResource()
	cases := map[string]struct {
		cr              *nsproxy.KVMProxy
		jitter          time.Duration
		lowest, highest time.Duration
		spreadAtLeastTo time.Duration
	}{
		"ReadyWideJitter":   {cr: ready, jitter: time.Minute, lowest: 4 * time.Minute, highest: 6 * time.Minute, spreadAtLeastTo: 30 * time.Second},
		"ReadyCappedJitter": {cr: ready, jitter: time.Hour, lowest: 5*time.Minute - 75*time.Second, highest: 5*time.Minute + 75*time.Second, spreadAtLeastTo: time.Minute},
		"NotReadyCapped":    {cr: notReady, jitter: time.Minute, lowest: 7500 * time.Millisecond, highest: 12500 * time.Millisecond, spreadAtLeastTo: time.Second},
		"NoJitter":          {cr: ready, lowest: 5 * time.Minute, highest: 5 * time.Minute},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			hook := PollHook(10*time.Second, tc.jitter)
			lo, hi := time.Duration(1<<62), time.Duration(0)
			for range 500 {
				d := hook(tc.cr, 5*time.Minute)
				lo, hi = min(lo, d), max(hi, d)
			}
			if lo < tc.lowest || hi > tc.highest {
				t.Errorf("polls from %s to %s; want within %s to %s", lo, hi, tc.lowest, tc.highest)
			}
			if hi-lo < tc.spreadAtLeastTo {
				t.Errorf("polls spread over %s (%s to %s); want at least %s", hi-lo, lo, hi, tc.spreadAtLeastTo)
			}
		})
	}
}
