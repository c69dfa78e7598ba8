package external

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Defaults of the stall guard: a call that has run stallAfter has
// stalled (the backends answer within seconds, Creates start work and
// return, and a request's own timeout is 30s); a config whose call ended
// stalled stays suspect for coolDown.
const (
	defaultStallAfter = 10 * time.Second
	defaultCoolDown   = 30 * time.Second
	// stalledInFlight is how many calls a stalled config may have in
	// flight: enough for a slow backend to go on, few enough that the
	// other configs keep the workers.
	stalledInFlight = 2
	// reasonBackendStalled is the Reason of the guard's refusals.
	reasonBackendStalled = "BackendStalled"
)

// stallGuard keeps one config's backend from holding a kind's workers:
// a config that names a server which accepts connections and never
// answers (a tenant's Proxmox URL or kubeconfig server, an overloaded
// host) would otherwise hold a worker for each of its proxies' calls,
// until every proxy of the kind waits behind it. Per config:
//
//   - at most limit calls are in flight; one more waits for a slot while
//     the config's calls are quick, and is refused once one has stalled;
//   - while one of its calls has run stallAfter, or for coolDown after
//     one ended so, at most stalledInFlight are in flight, and the others
//     are refused at once (Transient, with RetryAfter).
//
// A refusal names the config and holds no worker. Quick backends never
// meet it: a call waits only while its config has limit calls in flight.
type stallGuard struct {
	limit      int
	stallAfter time.Duration
	coolDown   time.Duration
	now        func() time.Time

	mu      sync.Mutex
	configs map[string]*configCalls
}

// configCalls are one config's calls in flight and its last stall.
type configCalls struct {
	started map[uint64]time.Time
	next    uint64
	// stalledAt is when a call of the config last ended after running
	// stallAfter or longer.
	stalledAt time.Time
	// ended is closed, and replaced, whenever a call ends.
	ended chan struct{}
}

// newStallGuard returns a guard that lets one config hold half of
// workers (at least stalledInFlight).
func newStallGuard(workers int) *stallGuard {
	return &stallGuard{
		limit:      max(workers/2, stalledInFlight),
		stallAfter: defaultStallAfter,
		coolDown:   defaultCoolDown,
		now:        time.Now,
		configs:    map[string]*configCalls{},
	}
}

// enter starts a call of config, waiting for a slot while the config's
// calls are quick, and returns the function that ends it; or the error
// that refuses it.
func (g *stallGuard) enter(ctx context.Context, config string) (func(), error) {
	for {
		g.mu.Lock()
		c := g.configs[config]
		if c == nil {
			c = &configCalls{started: map[uint64]time.Time{}, ended: make(chan struct{})}
			g.configs[config] = c
		}
		now := g.now()
		oldest := g.oldest(c)
		stalled := len(c.started) > 0 && now.Sub(oldest) >= g.stallAfter
		suspect := stalled || (!c.stalledAt.IsZero() && now.Sub(c.stalledAt) < g.coolDown)
		room := g.limit
		if suspect {
			room = stalledInFlight
		}
		if len(c.started) < room {
			id := c.next
			c.next++
			c.started[id] = now
			g.mu.Unlock()
			return func() { g.exit(config, id) }, nil
		}
		if suspect {
			g.mu.Unlock()
			return nil, g.refusal(config, len(c.started), stalled)
		}
		// Full and quick: wait for a call to end, or for the oldest to
		// stall.
		ended := c.ended
		wait := g.stallAfter - now.Sub(oldest)
		g.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ended:
			t.Stop()
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, proxy.Classify(proxy.ClassTransient, errors.Wrapf(ctx.Err(), "%s: waited for one of its %d calls to its backend in flight to end", config, g.limit))
		}
	}
}

// oldest is when c's oldest call in flight started; c has one at least
// when it matters.
func (g *stallGuard) oldest(c *configCalls) time.Time {
	var o time.Time
	for _, t := range c.started {
		if o.IsZero() || t.Before(o) {
			o = t
		}
	}
	return o
}

func (g *stallGuard) exit(config string, id uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.configs[config]
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
	close(c.ended)
	c.ended = make(chan struct{})
	if len(c.started) == 0 && (c.stalledAt.IsZero() || now.Sub(c.stalledAt) >= g.coolDown) {
		delete(g.configs, config)
	}
	// A config that stalled keeps its entry until its next call after
	// coolDown; drop those that never came back.
	if len(g.configs) > 64 {
		for k, o := range g.configs {
			if len(o.started) == 0 && now.Sub(o.stalledAt) >= g.coolDown {
				delete(g.configs, k)
			}
		}
	}
}

func (g *stallGuard) refusal(config string, inFlight int, now bool) error {
	why := fmt.Sprintf("a call ended after %s or longer within the last %s", g.stallAfter, g.coolDown)
	if now {
		why = fmt.Sprintf("a call has run %s or longer", g.stallAfter)
	}
	return &proxy.Error{Class: proxy.ClassTransient, Provider: config, Reason: reasonBackendStalled, RetryAfter: g.coolDown / 3,
		Err: errors.Errorf("its backend is not answering in time (%s; %d calls in flight): the calls of its other proxies wait, so that one backend cannot hold every worker of the provider; is the backend up and answering?", why, inFlight)}
}

// wrap returns d with every instance call of config passing the guard.
func (g *stallGuard) wrap(config string, d proxy.Driver) proxy.Driver {
	if g == nil {
		return d
	}
	return &guardedDriver{Driver: d, g: g, config: config}
}

// guardedDriver is a Driver whose instance calls pass a stallGuard;
// List and Check (the sweep's and health checks', on workers of their
// own) pass through.
type guardedDriver struct {
	proxy.Driver
	g      *stallGuard
	config string
}

func (d *guardedDriver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	done, err := d.g.enter(ctx, d.config)
	if err != nil {
		return proxy.Instance{}, err
	}
	defer done()
	return d.Driver.Create(ctx, req)
}

func (d *guardedDriver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	done, err := d.g.enter(ctx, d.config)
	if err != nil {
		return proxy.Instance{}, err
	}
	defer done()
	return d.Driver.Get(ctx, ref)
}

func (d *guardedDriver) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	done, err := d.g.enter(ctx, d.config)
	if err != nil {
		return proxy.Instance{}, err
	}
	defer done()
	return d.Driver.Update(ctx, ref, req)
}

func (d *guardedDriver) Delete(ctx context.Context, ref proxy.Ref) error {
	done, err := d.g.enter(ctx, d.config)
	if err != nil {
		return err
	}
	defer done()
	return d.Driver.Delete(ctx, ref)
}

// stalledRefusal reports whether err is the guard's refusal, whose wait
// is the provider's, not the backend's.
func stalledRefusal(err error) bool {
	var pe *proxy.Error
	return errors.As(err, &pe) && pe.Reason == reasonBackendStalled
}
