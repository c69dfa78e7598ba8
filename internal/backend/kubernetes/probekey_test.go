package kubernetes

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestAnotherConfigsReadOfAPodLeavesItsProbeAlone: every kubernetes
// driver shares the binding's readiness prober. A tenant's ProviderConfig
// whose kubeconfig names the platform's cluster reads a platform proxy's
// Deployment by its name (an Observe-only import, which the controller
// then refuses): that read must not take the platform proxy's place in the
// prober, whose answer stays its own.
func TestAnotherConfigsReadOfAPodLeavesItsProbeAlone(t *testing.T) {
	cases := map[string]struct {
		reason      string
		tenantReads int
		want        bool
	}{
		"NoTenantRead": {
			reason: "The platform proxy's second Get answers from its own probe.",
			want:   true,
		},
		"TenantReadsBetween": {
			reason:      "The tenant's reads of the Deployment leave the platform proxy's probe as it was.",
			tenantReads: 3,
			want:        true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			mark := proxy.Mark{UID: "uid-platform", InstallationID: "inst-1"}
			labels := map[string]string{LabelManagedBy: ManagedBy, LabelName: "web", LabelUID: mark.UID, LabelInstallation: mark.InstallationID}
			dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: "web", Labels: labels,
				CreationTimestamp: metav1.Now()}}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: "web-1", UID: "pod-uid-1", Labels: labels},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.5",
					Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
			fc := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(dep, pod).WithStatusSubresource(pod).Build()

			var (
				mu     sync.Mutex
				silent bool
			)
			prober := &squid.Prober{Wait: time.Minute, PositiveTTL: time.Hour, NegativeTTL: time.Nanosecond,
				Ask: func(context.Context, string) (string, error) {
					mu.Lock()
					defer mu.Unlock()
					if silent {
						return "", errors.New("connection refused")
					}
					return squid.Identity(mark.UID), nil
				}}
			platform := New(Options{Provider: "ClusterProviderConfig pods", Config: Config{Namespace: "egress"}, Client: fc, Prober: prober, DialPods: true})
			tenant := New(Options{Provider: "ProviderConfig team-a/pods", Config: Config{Namespace: "egress"}, Client: fc, Prober: prober, DialPods: true})
			tenant.quiet, tenant.guard = true, netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})

			own := proxy.Ref{ID: "egress/web", Name: "web", Mark: mark}
			if got, err := platform.Get(ctx, own); err != nil || !got.ProxyReachable {
				t.Fatalf("platform Get = %+v, %v; want its proxy answering", got, err)
			}
			imp := proxy.Ref{Name: "web", Mark: proxy.Mark{UID: "uid-tenant", InstallationID: mark.InstallationID}, Live: true}
			for range tc.tenantReads {
				if _, err := tenant.Get(ctx, imp); err != nil {
					t.Fatalf("tenant Get: %v", err)
				}
			}
			// The platform's Squid is silent from now on: only its kept
			// answer says it serves.
			mu.Lock()
			silent = true
			mu.Unlock()
			got, err := platform.Get(ctx, own)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.ProxyReachable); diff != "" {
				t.Errorf("%s\nplatform proxy ProxyReachable after the tenant's reads: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}
