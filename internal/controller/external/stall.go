package external

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/utils/clock"

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
// config has at most allowance calls in flight; one more is refused at
// once (Transient: the resource's backoff), holding no worker. Quick
// calls are never held or refused.
//
// A key is a config, and for a cluster-scoped config used by namespaced
// resources the namespace too: what one tenant's proxies make slow (an
// image URL it names) holds back that tenant only. The calls of a
// namespaced config count against its namespace as well, by the same
// rule: a tenant's many configs naming one silent server share one
// allowance. Calls of a config whose last call ended quickly, and none
// stalled since, are not counted there, so that a tenant's working
// configs go on beside its silent one.
type stallGuard struct {
	stallAfter time.Duration
	coolDown   time.Duration
	// allowance is how many calls a stalled key, or namespace, keeps.
	allowance int
	now       func() time.Time

	mu      sync.Mutex
	next    uint64
	configs map[string]*configCalls
}

// guardKey is what a call counts against: key, and the namespace of a
// namespaced config ("" otherwise). namespace is the resource's
// namespace, for the drivers (proxy.WithTenant).
type guardKey struct {
	key       string
	group     string
	namespace string
}

// configCalls are one key's (or namespace's) calls in flight and its
// last stall.
type configCalls struct {
	started map[uint64]time.Time
	// free are the calls in flight that the namespace does not count.
	free map[uint64]bool
	// stalledAt is when a call of the key last ended after running
	// stallAfter or longer; quickAt when one last ended sooner.
	stalledAt, quickAt time.Time
}

func newStallGuard() *stallGuard {
	return &stallGuard{
		stallAfter: defaultStallAfter,
		coolDown:   defaultCoolDown,
		allowance:  stalledInFlight,
		now:        time.Now,
		configs:    map[string]*configCalls{},
	}
}

// stallKey is the guard's key of cfg for a resource in namespace.
func stallKey(cfg *Config, namespace string) guardKey {
	switch {
	case cfg.Namespaced:
		return guardKey{key: cfg.Name, group: "namespace " + namespace, namespace: namespace}
	case namespace == "":
		return guardKey{key: cfg.Name}
	}
	return guardKey{key: cfg.Name + " for namespace " + namespace, namespace: namespace}
}

// recent reports whether t is set and less than coolDown before now.
func (g *stallGuard) recent(t, now time.Time) bool {
	return !t.IsZero() && now.Sub(t) < g.coolDown
}

// stalled reports whether one of c's calls in flight has run stallAfter.
func (g *stallGuard) stalled(c *configCalls, now time.Time) bool {
	for _, t := range c.started {
		if now.Sub(t) >= g.stallAfter {
			return true
		}
	}
	return false
}

// suspect reports whether c's calls are held to the allowance.
func (g *stallGuard) suspect(c *configCalls, now time.Time) bool {
	return c != nil && (g.stalled(c, now) || g.recent(c.stalledAt, now))
}

// counted are a group's calls in flight that count against it: all but
// those started free (their config's last call ended quickly), and those
// too once they have run stallAfter, so that a config whose server went
// silent after a quick answer does not hold workers outside the count.
func (g *stallGuard) counted(grp *configCalls, now time.Time) int {
	n := 0
	for id, start := range grp.started {
		if !grp.free[id] || now.Sub(start) >= g.stallAfter {
			n++
		}
	}
	return n
}

func (g *stallGuard) entry(key string) *configCalls {
	c := g.configs[key]
	if c == nil {
		c = &configCalls{started: map[uint64]time.Time{}, free: map[uint64]bool{}}
		g.configs[key] = c
	}
	return c
}

// enter starts a call of k and returns the function that ends it, or
// the error that refuses it.
func (g *stallGuard) enter(k guardKey) (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	c := g.configs[k.key]
	if g.suspect(c, now) && len(c.started) >= g.allowance {
		return nil, g.refusal(k.key, "", len(c.started), g.stalled(c, now))
	}
	free := false
	if k.group != "" {
		free = c != nil && !g.suspect(c, now) && g.recent(c.quickAt, now)
		if grp := g.configs[k.group]; !free && g.suspect(grp, now) {
			if counted := g.counted(grp, now); counted >= g.allowance {
				return nil, g.refusal(k.key, k.group, counted, g.stalled(grp, now))
			}
		}
	}
	id := g.next
	g.next++
	g.entry(k.key).started[id] = now
	if k.group != "" {
		grp := g.entry(k.group)
		grp.started[id] = now
		if free {
			grp.free[id] = true
		}
	}
	return func() { g.exit(k, id) }, nil
}

func (g *stallGuard) exit(k guardKey, id uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	for _, key := range []string{k.key, k.group} {
		c := g.configs[key]
		if c == nil {
			continue
		}
		if start, ok := c.started[id]; ok {
			switch {
			case now.Sub(start) >= g.stallAfter:
				c.stalledAt = now
			case key == k.key && k.group != "":
				// Only a namespaced config's calls are ever free.
				c.quickAt = now
			}
			delete(c.started, id)
			delete(c.free, id)
		}
		if g.idle(c, now) {
			delete(g.configs, key)
		}
	}
	// A key keeps its entry for coolDown after its last call; drop those
	// that never came back.
	if len(g.configs) > 64 {
		for key, c := range g.configs {
			if g.idle(c, now) {
				delete(g.configs, key)
			}
		}
	}
}

// idle reports whether c holds nothing the guard still needs.
func (g *stallGuard) idle(c *configCalls, now time.Time) bool {
	return len(c.started) == 0 && !g.recent(c.stalledAt, now) && !g.recent(c.quickAt, now)
}

// refusal is the error refusing a call of key, as the key's own or (group
// set) as its namespace's.
func (g *stallGuard) refusal(key, group string, inFlight int, now bool) error {
	why := fmt.Sprintf("a call ended after %s or longer within the last %s", g.stallAfter, g.coolDown)
	if now {
		why = fmt.Sprintf("a call has run %s or longer", g.stallAfter)
	}
	what := "its backend is"
	if group != "" {
		what = "the backends of the configs in " + group + " are"
	}
	return &proxy.Error{Class: proxy.ClassTransient, Provider: key, Reason: reasonBackendStalled,
		Err: errors.Errorf("%s not answering in time (%s; %d calls in flight): its other calls wait, so that one backend cannot hold every worker of the provider; is the backend, or what this resource names (an image URL), up and answering?", what, why, inFlight)}
}

// wrap returns d with every instance call passing the guard under k.
func (g *stallGuard) wrap(k guardKey, d proxy.Driver) proxy.Driver {
	if g == nil {
		return d
	}
	return &guardedDriver{Driver: d, g: g, key: k}
}

// guardedDriver is a Driver whose instance calls pass a stallGuard, and
// carry the resource's namespace (proxy.WithTenant) for what a driver
// shares among tenants itself (KVM's image downloads). List and Check
// (the sweep's and health checks', on workers of their own, with guards
// of their own: CheckGuard) pass through.
type guardedDriver struct {
	proxy.Driver
	g   *stallGuard
	key guardKey
}

// call runs f as one call of d's key, unless the guard refuses it.
func call[T any](ctx context.Context, d *guardedDriver, f func(context.Context) (T, error)) (T, error) {
	done, err := d.g.enter(d.key)
	if err != nil {
		var zero T
		return zero, err
	}
	defer done()
	return f(proxy.WithTenant(ctx, d.key.namespace))
}

func (d *guardedDriver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	return call(ctx, d, func(ctx context.Context) (proxy.Instance, error) { return d.Driver.Create(ctx, req) })
}

func (d *guardedDriver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	return call(ctx, d, func(ctx context.Context) (proxy.Instance, error) { return d.Driver.Get(ctx, ref) })
}

func (d *guardedDriver) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	return call(ctx, d, func(ctx context.Context) (proxy.Instance, error) { return d.Driver.Update(ctx, ref, req) })
}

func (d *guardedDriver) Delete(ctx context.Context, ref proxy.Ref) error {
	_, err := call(ctx, d, func(ctx context.Context) (struct{}, error) { return struct{}{}, d.Driver.Delete(ctx, ref) })
	return err
}

// CheckGuard holds the stalled checks of one kind's configs (health
// checks, orphan sweeps) the way stallGuard holds proxies' calls: the
// checks of a namespace's configs whose backends do not answer, together,
// keep at most its allowance of those workers, and the other configs'
// checks go on.
type CheckGuard struct{ g *stallGuard }

// NewCheckGuard returns a CheckGuard leaving a stalled namespace allowance
// checks in flight (at least one), timed by clk.
func NewCheckGuard(allowance int, clk clock.PassiveClock) *CheckGuard {
	g := newStallGuard()
	g.allowance = max(allowance, 1)
	g.now = clk.Now
	return &CheckGuard{g: g}
}

// Enter starts a check of cfg, read from namespace ("" for a
// cluster-scoped config), and returns the function that ends it, or the
// error that refuses it (Transient, Reason BackendStalled).
func (c *CheckGuard) Enter(cfg *Config, namespace string) (func(), error) {
	if c == nil {
		return func() {}, nil
	}
	return c.g.enter(stallKey(cfg, namespace))
}
