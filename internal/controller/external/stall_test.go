package external

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

func guardAt() (*stallGuard, *testingclock.FakeClock) {
	c := testingclock.NewFakeClock(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
	g := newStallGuard()
	g.now = c.Now
	return g, c
}

// enterAll enters n calls of key, failing the test on a refusal.
func enterAll(t *testing.T, g *stallGuard, key guardKey, n int) []func() {
	t.Helper()
	var done []func()
	for range n {
		d, err := g.enter(key)
		if err != nil {
			t.Fatalf("enter %s: %v", key, err)
		}
		done = append(done, d)
	}
	return done
}

func endAll(done []func()) {
	for _, d := range done {
		d()
	}
}

func TestStallGuardNeverHoldsQuickCalls(t *testing.T) {
	g, c := guardAt()
	// However many, while none has run 5s.
	pve := guardKey{key: "ProviderConfig team-a/pve"}
	done := enterAll(t, g, pve, 50)
	c.Step(defaultStallAfter - time.Millisecond)
	endAll(done)
	endAll(enterAll(t, g, pve, 50))
	if len(g.configs) != 0 {
		t.Errorf("the guard keeps %d keys after their calls ended quickly, want none", len(g.configs))
	}
}

func TestStallGuardRefusesAtOnceWhileACallStalls(t *testing.T) {
	g, c := guardAt()
	slow := guardKey{key: "ProviderConfig team-a/pve"}
	done := enterAll(t, g, slow, 2)
	c.Step(defaultStallAfter)
	_, err := g.enter(slow)
	if err == nil {
		t.Fatal("a third call of a config whose calls have run 5s went on")
	}
	for _, want := range []string{slow.key + ": ", "not answering in time", "a call has run 5s or longer", "2 calls in flight"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	if !proxy.IsTransient(err) || proxy.RetryAfterOf(err) != 0 {
		t.Errorf("the refusal is %s with RetryAfter %s, want Transient and the resource's own backoff", proxy.ClassOf(err), proxy.RetryAfterOf(err))
	}

	// Another key goes on.
	endAll(enterAll(t, g, guardKey{key: "ProviderConfig team-b/pve"}, 10))

	// One of the two ends, stalled: a stalled config may still have two
	// in flight, no more.
	done[0]()
	more := enterAll(t, g, slow, 1)
	if _, err := g.enter(slow); err == nil {
		t.Error("a stalled config had three calls in flight")
	}
	done[1]()
	more[0]()

	// Suspect for 2m after a call ended stalled, then quick again.
	c.Step(defaultCoolDown - time.Second)
	two := enterAll(t, g, slow, 2)
	if _, err := g.enter(slow); err == nil || !strings.Contains(err.Error(), "a call ended after 5s or longer within the last 2m0s") {
		t.Errorf("within 2m of a stalled call, a third call got %v, want the refusal naming the stall", err)
	}
	endAll(two)
	c.Step(time.Second)
	endAll(enterAll(t, g, slow, 10))
	if len(g.configs) != 0 {
		t.Errorf("the guard keeps %d keys once their stall is 2m old and nothing is in flight, want none", len(g.configs))
	}
}

func TestStallKey(t *testing.T) {
	platform := &Config{Name: "ClusterProviderConfig home"}
	tenant := &Config{Name: "ProviderConfig team-a/pve", Namespaced: true}
	for _, tc := range []struct {
		cfg       *Config
		namespace string
		want      guardKey
	}{
		// A tenant's configs share its namespace's allowance too.
		{tenant, "team-a", guardKey{key: "ProviderConfig team-a/pve", group: "namespace team-a", namespace: "team-a"}},
		// What one tenant's proxies make slow on the platform's config
		// holds back that tenant only.
		{platform, "team-a", guardKey{key: "ClusterProviderConfig home for namespace team-a", namespace: "team-a"}},
		{platform, "", guardKey{key: "ClusterProviderConfig home"}},
	} {
		if got := stallKey(tc.cfg, tc.namespace); got != tc.want {
			t.Errorf("stallKey(%s, %q) = %+v, want %+v", tc.cfg.Name, tc.namespace, got, tc.want)
		}
	}
}

// hangingDriver is a driver whose Gets of one config never answer until
// their context ends, as a server that accepts and stays silent.
type hangingDriver struct {
	*proxytest.Memory
	inFlight, most atomic.Int32
}

func (d *hangingDriver) Get(ctx context.Context, _ proxy.Ref) (proxy.Instance, error) {
	n := d.inFlight.Add(1)
	defer d.inFlight.Add(-1)
	for {
		m := d.most.Load()
		if n <= m || d.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-ctx.Done()
	return proxy.Instance{}, proxy.Transientf("%v", ctx.Err())
}

// TestSilentBackendLeavesTheWorkersToOthers: a tenant whose backend
// never answers; once two of its calls have run 5s, each further
// reconcile of its proxies ends at once with a refusal naming the config,
// holding no worker, while another tenant's proxies are observed as
// usual.
func TestSilentBackendLeavesTheWorkersToOthers(t *testing.T) {
	hang := &hangingDriver{Memory: proxytest.NewMemory("memory", "proxytest-installation")}
	mem := proxytest.NewMemory("memory", "proxytest-installation")
	k := testKind(nil)
	k.Backend.Connect = func(_ context.Context, cfg *Config) (proxy.Driver, error) {
		if cfg.Name == "ProviderConfig team-a/silent" {
			return hang, nil
		}
		return mem, nil
	}
	get := func(_ context.Context, key client.ObjectKey, obj client.Object) error {
		pc, ok := obj.(*nsv1alpha1.ProviderConfig)
		if !ok {
			return errors.Errorf("unexpected Get of %T", obj)
		}
		pc.Namespace, pc.Name = key.Namespace, key.Name
		pc.Spec.KVM = &spec.KVMConfig{}
		return nil
	}
	g, clk := guardAt()
	c := &connector[spec.KVMProxyParameters]{
		kind:      k,
		configs:   ConfigReader{Kube: &test.MockClient{MockGet: get}, Backends: []Backend{k.Backend}},
		modern:    resource.ModernTrackerFn(func(context.Context, resource.ModernManaged) error { return nil }),
		passwords: &Passwords{key: []byte("k")},
		hints:     newRetryHints(0),
		stalls:    g,
	}
	observe := func(ctx context.Context, ns, config string, i int) error {
		cr := proxyResource(func(cr *nsproxy.KVMProxy) {
			cr.Namespace, cr.Name = ns, fmt.Sprintf("web-%d", i)
			cr.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: config})
		})
		ec, err := c.Connect(ctx, cr)
		if err != nil {
			return err
		}
		_, err = ec.Observe(ctx, cr)
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { _ = observe(ctx, "team-a", "silent", i) })
	}
	deadline := time.Now().Add(5 * time.Second)
	for hang.inFlight.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	clk.Step(defaultStallAfter)

	for i := 2; i < 10; i++ {
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := observe(rctx, "team-a", "silent", i)
		rcancel()
		for _, want := range []string{"cannot observe the instance", "ProviderConfig team-a/silent: its backend is not answering in time", "(Transient, will retry)"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("reconcile %d of a proxy on the stalled config got %v, want at once a refusal saying %q", i, err, want)
			}
		}
	}
	if err := observe(context.Background(), "team-b", "working", 0); err != nil {
		t.Errorf("another tenant's proxy could not be observed while one config's backend was silent: %v", err)
	}
	cancel()
	wg.Wait()
	if got := hang.most.Load(); got != 2 {
		t.Errorf("%d calls reached the silent backend at once, want 2", got)
	}
}

// TestStallGuardHoldsANamespaceNotEachConfig: a tenant's five configs
// naming one silent server share one allowance (a sixth made for it too),
// while another tenant, the platform's config and the tenant's config that
// answers go on.
func TestStallGuardHoldsANamespaceNotEachConfig(t *testing.T) {
	g, c := guardAt()
	tenant := func(name string) guardKey {
		return stallKey(&Config{Name: "ProviderConfig team-a/" + name, Namespaced: true}, "team-a")
	}
	working := tenant("working")
	endAll(enterAll(t, g, working, 1))
	var stalled []func()
	for i := range 5 {
		stalled = append(stalled, enterAll(t, g, tenant(fmt.Sprint("pve-", i)), 2)...)
	}
	c.Step(defaultStallAfter)

	for i := range 5 {
		if _, err := g.enter(tenant(fmt.Sprint("pve-", i))); err == nil {
			t.Errorf("a third call of stalled config pve-%d went on", i)
		}
	}
	// A config made for the same server counts with them.
	_, err := g.enter(tenant("pve-5"))
	want := "ProviderConfig team-a/pve-5: the backends of the configs in namespace team-a are not answering in time (a call has run 5s or longer; 10 calls in flight)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a call of a new config of the stalled namespace got %v, want a refusal saying %q", err, want)
	}
	endAll(enterAll(t, g, stallKey(&Config{Name: "ProviderConfig team-b/pve", Namespaced: true}, "team-b"), 3))
	endAll(enterAll(t, g, stallKey(&Config{Name: "ClusterProviderConfig home"}, "team-a"), 3))
	endAll(enterAll(t, g, working, 3))

	// Their calls end, stalled: the namespace keeps two in flight, not two
	// per config.
	endAll(stalled)
	inFlight := 0
	for range 3 {
		for i := range 6 {
			if done, err := g.enter(tenant(fmt.Sprint("pve-", i))); err == nil {
				defer done()
				inFlight++
			}
		}
	}
	if inFlight != stalledInFlight {
		t.Errorf("namespace team-a's stalled configs got %d calls in flight, want %d", inFlight, stalledInFlight)
	}
	endAll(enterAll(t, g, working, 3))
}

// tenantDriver records the tenant of its last Get.
type tenantDriver struct {
	proxy.Driver
	tenant string
}

func (d *tenantDriver) Get(ctx context.Context, _ proxy.Ref) (proxy.Instance, error) {
	d.tenant = proxy.TenantOf(ctx)
	return proxy.Instance{}, nil
}

// TestGuardedDriverCarriesTheNamespace: the drivers see whose call it is,
// on the platform's config too.
func TestGuardedDriverCarriesTheNamespace(t *testing.T) {
	g, _ := guardAt()
	for _, cfg := range []*Config{{Name: "ClusterProviderConfig home"}, {Name: "ProviderConfig team-a/pve", Namespaced: true}} {
		d := &tenantDriver{}
		if _, err := g.wrap(stallKey(cfg, "team-a"), d).Get(context.Background(), proxy.Ref{}); err != nil {
			t.Fatal(err)
		}
		if d.tenant != "team-a" {
			t.Errorf("a call through %s carried tenant %q, want team-a", cfg.Name, d.tenant)
		}
	}
}

// TestQuickConfigsThatStallCountForTheNamespace: a tenant's configs whose
// server answered quickly, then went silent, start their calls free of
// the namespace's count; once those have run the stall time they count,
// and the namespace gets no more calls in.
func TestQuickConfigsThatStallCountForTheNamespace(t *testing.T) {
	g, c := guardAt()
	tenant := func(name string) guardKey {
		return stallKey(&Config{Name: "ProviderConfig team-a/" + name, Namespaced: true}, "team-a")
	}
	for i := range 5 {
		endAll(enterAll(t, g, tenant(fmt.Sprint("pve-", i)), 1)) // quick
	}
	var stalled []func()
	for i := range 5 {
		stalled = append(stalled, enterAll(t, g, tenant(fmt.Sprint("pve-", i)), 2)...)
	}
	defer endAll(stalled)
	c.Step(defaultStallAfter)
	admitted := 0
	for i := range 7 {
		if done, err := g.enter(tenant(fmt.Sprint("pve-", i))); err == nil {
			defer done()
			admitted++
		}
	}
	if admitted != 0 {
		t.Errorf("with %d of its calls stalled, namespace team-a got %d more in; want none", len(stalled), admitted)
	}
}
