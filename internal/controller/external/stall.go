package external

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// reasonBackendStalled is the Reason of the guard's refusals.
const reasonBackendStalled = "BackendStalled"

// Defaults of the stall guard: a call that has run stallAfter has
// stalled (the backends answer within a second or two, Creates start
// work and return, and a request's own timeout is 30s); a config whose
// call ended stalled stays suspect for coolDown.
const (
	defaultStallAfter = 5 * time.Second
	defaultCoolDown   = 2 * time.Minute
	// stalledInFlight is how many calls a stalled config may have in
	// flight: enough for a slow backend to go on, few enough that the
	// other configs keep the workers.
	stalledInFlight = 2
)

// stallGuard keeps one config's backend from holding a kind's workers:
// a config that names a server which accepts connections and never
// answers (a tenant's Proxmox URL or kubeconfig server, a tenant's image
// URL) would otherwise hold a worker for each of its proxies' calls,
// until every proxy of the kind waits behind it. While one of a config's
// calls has run stallAfter, or for coolDown after one ended so, the
// config has at most stalledInFlight calls in flight; one more is
// refused at once (Transient: the resource's backoff), holding no
// worker. Quick calls are never held or refused.
//
// A key is a config, and for a cluster-scoped config used by namespaced
// resources the namespace too: what one tenant's proxies make slow (an
// image URL it names) holds back that tenant only.
type stallGuard struct {
	stallAfter time.Duration
	coolDown   time.Duration
	now        func() time.Time

	mu      sync.Mutex
	configs map[string]*configCalls
}

// configCalls are one key's calls in flight and its last stall.
type configCalls struct {
	started map[uint64]time.Time
	next    uint64
	// stalledAt is when a call of the key last ended after running
	// stallAfter or longer.
	stalledAt time.Time
}

func newStallGuard() *stallGuard {
	return &stallGuard{
		stallAfter: defaultStallAfter,
		coolDown:   defaultCoolDown,
		now:        time.Now,
		configs:    map[string]*configCalls{},
	}
}

// stallKey is the guard's key of cfg for a resource in namespace.
func stallKey(cfg *Config, namespace string) string {
	if cfg.Namespaced || namespace == "" {
		return cfg.Name
	}
	return cfg.Name + " for namespace " + namespace
}

// enter starts a call of key and returns the function that ends it, or
// the error that refuses it.
func (g *stallGuard) enter(key string) (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.configs[key]
	if c == nil {
		c = &configCalls{started: map[uint64]time.Time{}}
		g.configs[key] = c
	}
	now := g.now()
	stalled := false
	for _, t := range c.started {
		if now.Sub(t) >= g.stallAfter {
			stalled = true
			break
		}
	}
	recently := !c.stalledAt.IsZero() && now.Sub(c.stalledAt) < g.coolDown
	if (stalled || recently) && len(c.started) >= stalledInFlight {
		return nil, g.refusal(key, len(c.started), stalled)
	}
	id := c.next
	c.next++
	c.started[id] = now
	return func() { g.exit(key, id) }, nil
}

func (g *stallGuard) exit(key string, id uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.configs[key]
	if c == nil {
		return
	}
	now := g.now()
	if start, ok := c.started[id]; ok {
		if now.Sub(start) >= g.stallAfter {
			c.stalledAt = now
		}
		delete(c.started, id)
	}
	if len(c.started) == 0 && (c.stalledAt.IsZero() || now.Sub(c.stalledAt) >= g.coolDown) {
		delete(g.configs, key)
	}
	// A key that stalled keeps its entry until its next call after
	// coolDown; drop those that never came back.
	if len(g.configs) > 64 {
		for k, o := range g.configs {
			if len(o.started) == 0 && now.Sub(o.stalledAt) >= g.coolDown {
				delete(g.configs, k)
			}
		}
	}
}

func (g *stallGuard) refusal(key string, inFlight int, now bool) error {
	why := fmt.Sprintf("a call ended after %s or longer within the last %s", g.stallAfter, g.coolDown)
	if now {
		why = fmt.Sprintf("a call has run %s or longer", g.stallAfter)
	}
	return &proxy.Error{Class: proxy.ClassTransient, Provider: key, Reason: reasonBackendStalled,
		Err: errors.Errorf("its backend is not answering in time (%s; %d calls in flight): its other calls wait, so that one backend cannot hold every worker of the provider; is the backend, or what this resource names (an image URL), up and answering?", why, inFlight)}
}

// wrap returns d with every instance call passing the guard under key.
func (g *stallGuard) wrap(key string, d proxy.Driver) proxy.Driver {
	if g == nil {
		return d
	}
	return &guardedDriver{Driver: d, g: g, key: key}
}

// guardedDriver is a Driver whose instance calls pass a stallGuard;
// List and Check (the sweep's and health checks', on workers of their
// own) pass through.
type guardedDriver struct {
	proxy.Driver
	g   *stallGuard
	key string
}

// call runs f as one call of d's key, unless the guard refuses it.
func call[T any](d *guardedDriver, f func() (T, error)) (T, error) {
	done, err := d.g.enter(d.key)
	if err != nil {
		var zero T
		return zero, err
	}
	defer done()
	return f()
}

func (d *guardedDriver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	return call(d, func() (proxy.Instance, error) { return d.Driver.Create(ctx, req) })
}

func (d *guardedDriver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	return call(d, func() (proxy.Instance, error) { return d.Driver.Get(ctx, ref) })
}

func (d *guardedDriver) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	return call(d, func() (proxy.Instance, error) { return d.Driver.Update(ctx, ref, req) })
}

func (d *guardedDriver) Delete(ctx context.Context, ref proxy.Ref) error {
	_, err := call(d, func() (struct{}, error) { return struct{}{}, d.Driver.Delete(ctx, ref) })
	return err
}
