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
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// clock is a settable time for the stall guard's ages.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func guardAt(workers int) (*stallGuard, *clock) {
	c := &clock{t: time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)}
	g := newStallGuard(workers)
	g.now = c.now
	return g, c
}

// enterAll enters n calls of config, failing the test on a refusal.
func enterAll(t *testing.T, g *stallGuard, config string, n int) []func() {
	t.Helper()
	var done []func()
	for range n {
		d, err := g.enter(context.Background(), config)
		if err != nil {
			t.Fatalf("enter %s: %v", config, err)
		}
		done = append(done, d)
	}
	return done
}

// enterAsync enters a call of config in a goroutine: its result arrives
// on the channel.
func enterAsync(g *stallGuard, config string) <-chan error {
	res := make(chan error, 1)
	go func() {
		done, err := g.enter(context.Background(), config)
		if done != nil {
			done()
		}
		res <- err
	}()
	return res
}

func TestStallGuardQuickCallsWaitForASlot(t *testing.T) {
	g, _ := guardAt(10)
	done := enterAll(t, g, "ProviderConfig team-a/pve", 5)
	res := enterAsync(g, "ProviderConfig team-a/pve")
	select {
	case err := <-res:
		t.Fatalf("a sixth call of a config with five quick calls in flight went on (err %v): it should wait for a slot", err)
	case <-time.After(100 * time.Millisecond):
	}
	done[0]()
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("the waiting call was refused once a slot was free: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting call did not go on when a call ended")
	}
	for _, d := range done[1:] {
		d()
	}
	if len(g.configs) != 0 {
		t.Errorf("the guard keeps %d configs after their calls ended quickly, want none", len(g.configs))
	}
}

func TestStallGuardRefusesAtOnceWhileACallStalls(t *testing.T) {
	g, c := guardAt(10)
	const slow = "ProviderConfig team-a/pve"
	done := enterAll(t, g, slow, 2)
	c.add(defaultStallAfter)
	start := time.Now()
	_, err := g.enter(context.Background(), slow)
	if err == nil {
		t.Fatal("a third call of a config whose calls have run 10s went on")
	}
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("the refusal took %s: it should come at once, holding no worker", waited)
	}
	for _, want := range []string{slow + ": ", "not answering in time", "a call has run 10s or longer", "2 calls in flight"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	if !proxy.IsTransient(err) || proxy.RetryAfterOf(err) != 10*time.Second || !stalledRefusal(err) {
		t.Errorf("the refusal is %s with RetryAfter %s, want Transient, 10s and the guard's reason", proxy.ClassOf(err), proxy.RetryAfterOf(err))
	}

	// Another config goes on, to its own limit.
	for _, d := range enterAll(t, g, "ProviderConfig team-b/pve", 5) {
		d()
	}

	// One of the two ends: a stalled config may still have two in flight.
	done[0]()
	more := enterAll(t, g, slow, 1)
	if _, err := g.enter(context.Background(), slow); err == nil {
		t.Error("a stalled config had three calls in flight")
	}
	done[1]()
	more[0]()

	// Suspect for 30s after a call ended stalled, then quick again.
	c.add(defaultCoolDown - time.Second)
	two := enterAll(t, g, slow, 2)
	if _, err := g.enter(context.Background(), slow); err == nil || !strings.Contains(err.Error(), "a call ended after 10s or longer within the last 30s") {
		t.Errorf("within 30s of a stalled call, a third call got %v, want the refusal naming the stall", err)
	}
	for _, d := range two {
		d()
	}
	c.add(time.Second)
	for _, d := range enterAll(t, g, slow, 5) {
		d()
	}
	if len(g.configs) != 0 {
		t.Errorf("the guard keeps %d configs once their stall is 30s old and nothing is in flight, want none", len(g.configs))
	}
}

func TestStallGuardWaiterRefusedWhenTheCallsStall(t *testing.T) {
	g, c := guardAt(4)
	const slow = "ProviderConfig team-a/pve"
	done := enterAll(t, g, slow, 2)
	c.add(defaultStallAfter - 50*time.Millisecond)
	res := enterAsync(g, slow)
	c.add(50 * time.Millisecond)
	select {
	case err := <-res:
		if err == nil || !stalledRefusal(err) {
			t.Errorf("a call waiting for a slot while the calls stalled got %v, want the refusal", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a call waiting for a slot was not refused when the calls in flight stalled")
	}
	for _, d := range done {
		d()
	}
}

func TestStallGuardWaiterStopsWithItsContext(t *testing.T) {
	g, _ := guardAt(4)
	done := enterAll(t, g, "ProviderConfig pve", 2)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() {
		_, err := g.enter(ctx, "ProviderConfig pve")
		res <- err
	}()
	cancel()
	select {
	case err := <-res:
		if err == nil || !errors.Is(err, context.Canceled) || !proxy.IsTransient(err) {
			t.Errorf("a waiting call whose context ended got %v, want a Transient error wrapping context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting call did not stop with its context")
	}
	for _, d := range done {
		d()
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

// TestSilentBackendLeavesTheWorkersToOthers: ten workers reconcile the
// proxies of a tenant whose backend never answers; at most half of them
// wait on it, and once its calls have stalled, the rest get a refusal
// naming the config at once, while another config's proxies are
// observed as usual.
func TestSilentBackendLeavesTheWorkersToOthers(t *testing.T) {
	const workers = 10
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
	g, clk := guardAt(workers)
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
	for i := range workers {
		wg.Go(func() { _ = observe(ctx, "team-a", "silent", i) })
	}
	deadline := time.Now().Add(5 * time.Second)
	for hang.inFlight.Load() < workers/2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if got := hang.most.Load(); got != workers/2 {
		t.Errorf("%d of %d workers waited on the silent backend at once, want %d", got, workers, workers/2)
	}

	// Another tenant's proxy is observed while the silent one's wait.
	if err := observe(context.Background(), "team-b", "working", 0); err != nil {
		t.Errorf("another config's proxy could not be observed while one config's backend was silent: %v", err)
	}

	// Once the calls have stalled, what a further reconcile of the
	// silent tenant's proxies says, at once.
	clk.add(defaultStallAfter)
	err := observe(context.Background(), "team-a", "silent", 99)
	for _, want := range []string{"cannot observe the instance", "ProviderConfig team-a/silent: its backend is not answering in time", "(Transient, will retry in 10s)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a reconcile of a proxy on the stalled config got %v, want it to say %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "as the backend asked") {
		t.Errorf("the refusal %q says the backend asked for the wait: the provider did", err)
	}
	cancel()
	wg.Wait()
	if got := hang.most.Load(); got != workers/2 {
		t.Errorf("%d calls reached the silent backend at once, want at most %d", got, workers/2)
	}
}
