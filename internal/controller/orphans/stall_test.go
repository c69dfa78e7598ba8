package orphans

import (
	"context"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestStalledNamespaceLeavesTheSweepWorkers: while a sweep of a tenant's
// config stalls, the tenant's other configs wait their turn, holding no
// sweep worker, and another tenant's config is swept.
func TestStalledNamespaceLeavesTheSweepWorkers(t *testing.T) {
	events := &recorded{}
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
	kube := &test.MockClient{
		MockGet: func(_ context.Context, key client.ObjectKey, obj client.Object) error {
			pc, ok := obj.(*nsv1alpha1.ProviderConfig)
			if !ok {
				return errors.Errorf("unexpected Get of %T", obj)
			}
			pc.Namespace, pc.Name = key.Namespace, key.Name
			pc.Spec.KVM = &spec.KVMConfig{}
			return nil
		},
		MockList:        test.NewMockListFn(nil),
		MockStatusPatch: test.NewMockSubResourcePatchFn(nil),
	}
	s := &Sweeper{
		Kube: kube,
		// No kinds: a sweep that runs fails at once, recording why.
		Configs: external.ConfigReader{Kube: kube, InstallationID: installation, Backends: []external.Backend{{
			Name:    "kvm",
			Block:   func(s *spec.ProviderConfigSpec) (external.Block, bool) { return external.Block{}, s.KVM != nil },
			Connect: func(context.Context, *external.Config) (proxy.Driver, error) { return nil, errors.New("unused") },
		}}},
		Interval:  time.Hour,
		Timeout:   30 * time.Second,
		Log:       logging.NewNopLogger(),
		Events:    events,
		kind:      "ProviderConfig",
		newConfig: func() config { return &nsv1alpha1.ProviderConfig{} },
		stalls:    external.NewCheckGuard(defaultWorkers/4, clk),
	}
	end, err := s.stalls.Enter(&external.Config{Name: "ProviderConfig team-a/silent", Namespaced: true}, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	defer end()
	clk.Step(5 * time.Second)

	var swept []string
	for _, nn := range []types.NamespacedName{{Namespace: "team-a", Name: "pve"}, {Namespace: "team-b", Name: "pve"}} {
		before := len(events.reasons())
		got, err := s.Reconcile(context.Background(), reconcile.Request{NamespacedName: nn})
		if len(events.reasons()) > before {
			swept = append(swept, nn.String())
		}
		if err != nil {
			t.Fatalf("sweep of %s: %v", nn, err)
		}
		if nn.Namespace == "team-a" && (got.RequeueAfter < 27*time.Second || got.RequeueAfter > 33*time.Second) {
			t.Errorf("the deferred sweep of %s requeues after %s, want about its 30s timeout", nn, got.RequeueAfter)
		}
	}
	if diff := cmp.Diff([]string{"team-b/pve"}, swept); diff != "" {
		t.Errorf("configs swept while team-a's sweep stalls: -want, +got:\n%s", diff)
	}
}
