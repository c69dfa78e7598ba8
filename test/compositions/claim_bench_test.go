package compositions_test

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

// BenchmarkClaimToReady measures, on the same stack as
// TestCompositionsIntegration, the time from creating an EgressProxyClaim
// to the claim reporting Ready=True: Crossplane core's claim and composite
// reconcilers, the function over mTLS, the provider's PodProxy controller,
// the kubelet stand-in starting a real Squid, and the readiness travelling
// back. Claims are created one after another; b.N of them. It reports the
// median and the maximum. Run it with hack/crossplane-claim-ready.sh.
func BenchmarkClaimToReady(b *testing.B) {
	e := start(b)
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N {
		claim := newObject(gvkClaim, "team-b", fmt.Sprintf("bench-%02d", i), map[string]any{
			"allowedClientCIDRs":         []any{"127.0.0.0/8"},
			"writeConnectionSecretToRef": map[string]any{"name": fmt.Sprintf("bench-%02d-proxy", i)},
		})
		t0 := time.Now()
		e.create(b, claim)
		e.ready(b, claim, 90*time.Second)
		took = append(took, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	median := took[len(took)/2]
	if len(took)%2 == 0 {
		median = (took[len(took)/2-1] + took[len(took)/2]) / 2
	}
	b.ReportMetric(median.Seconds(), "s-median-claim-to-ready")
	b.ReportMetric(took[len(took)-1].Seconds(), "s-max-claim-to-ready")
	b.ReportMetric(took[0].Seconds(), "s-min-claim-to-ready")
	b.Logf("claim to Ready over %d claims: median %.2fs, min %.2fs, max %.2fs; all: %v", len(took), median.Seconds(), took[0].Seconds(), took[len(took)-1].Seconds(), took)
}
