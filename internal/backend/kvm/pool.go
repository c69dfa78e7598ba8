package kvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
)

// Target is one host with the credentials to reach it.
type Target struct {
	Host  Host
	Creds Credentials
	// Guard dials a tenant's host (netguard); nil for the platform's.
	Guard *netguard.Guard
}

// key identifies the connection t builds: the same host reached with other
// credentials (a rotated Secret), or through a guard, is another
// connection.
func (t Target) key() string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%s\x00%s\x00%s\x00%p", t.Host.Address, t.Host.User, t.Host.socket(), t.Creds.digest(), t.Guard))
	return hex.EncodeToString(h[:16])
}

// endpoint identifies the libvirtd t reaches, whatever the credentials.
func (t Target) endpoint() string { return t.Host.Address + t.Host.socket() }

// conn is one dialled connection: the seam over it, and its link.
type conn struct {
	api  Libvirt
	link *link
}

// dialFunc dials one connection (production: sshDialer.dial; tests: a fake).
type dialFunc func(ctx context.Context, t Target) (*conn, error)

// connPool holds one pooled connection per host and credentials. Callers
// for one key dial once and share the result; a connection that closed or
// was retired is replaced on the next get; when the credentials for an
// endpoint change, the connection built from the old ones is retired (its
// running calls finish) and the next get dials with the new ones.
type connPool struct {
	dial   dialFunc
	tracer trace.Tracer
	log    func(context.Context) logr.Logger

	mu      sync.Mutex
	conns   map[string]*conn  // by Target.key
	current map[string]string // endpoint to the key last dialled for it
	used    map[string]time.Time
	dials   keyedLocks
	// idle is how long a connection no call asked for is kept (its
	// config is gone, or its host or credentials changed).
	idle time.Duration
	now  func() time.Time
}

// connIdle is connPool.idle by default.
const connIdle = 10 * time.Minute

func newConnPool(dial dialFunc, tracer trace.Tracer, log func(context.Context) logr.Logger) *connPool {
	return &connPool{dial: dial, tracer: tracer, log: log, conns: map[string]*conn{}, current: map[string]string{}, used: map[string]time.Time{},
		idle: connIdle, now: time.Now}
}

// get returns the pooled connection for t, dialling it when there is none.
func (p *connPool) get(ctx context.Context, t Target) (Libvirt, error) {
	key := t.key()
	p.evictIdle(ctx, key)
	if c := p.live(key); c != nil {
		return c.api, nil
	}
	unlock, err := p.dials.lock(ctx, key)
	if err != nil {
		return nil, classify("", err)
	}
	defer unlock()
	if c := p.live(key); c != nil {
		return c.api, nil
	}
	c, err := p.fresh(ctx, t)
	if err != nil {
		return nil, err
	}
	c.link.setOnRetire(func(l *link) { p.drop(key, l) })
	p.mu.Lock()
	p.conns[key] = c
	p.used[key] = p.now()
	old := p.current[t.endpoint()]
	p.current[t.endpoint()] = key
	var retire *conn
	if old != "" && old != key {
		retire = p.conns[old]
		delete(p.conns, old)
	}
	p.mu.Unlock()
	if retire != nil {
		p.log(ctx).WithValues(onHost(ctx, t.Host.Name)...).V(1).Info("credentials changed; retiring the connection built from the old ones")
		retire.link.retire("credentials changed")
	}
	p.log(ctx).WithValues(onHost(ctx, t.Host.Name)...).V(1).Info("libvirt host connected", "address", t.Host.Address)
	return c.api, nil
}

// fresh dials a connection outside the pool (health checks, image
// downloads): the caller closes it, and nobody else's work depends on it.
func (p *connPool) fresh(ctx context.Context, t Target) (*conn, error) {
	c, err := p.dial(ctx, t)
	if err != nil {
		p.log(ctx).WithValues(onHost(ctx, t.Host.Name)...).V(1).Info("libvirt host connect failed", "address", t.Host.Address, "error", err.Error())
		return nil, classify("", err)
	}
	c.api = &observed{next: c.api, host: t.Host.Name, tracer: p.tracer, log: p.log}
	return c, nil
}

// onHost is the host field of a line, unless ctx's instance scope gives
// it already.
func onHost(ctx context.Context, host string) []any {
	if scoped(ctx) {
		return nil
	}
	return []any{"host", host}
}

// evictIdle retires the connections (other than keep's) no call asked
// for within p.idle: their calls in flight finish, then they close.
func (p *connPool) evictIdle(ctx context.Context, keep string) {
	p.mu.Lock()
	var idle []*conn
	for k, c := range p.conns {
		if k != keep && p.now().Sub(p.used[k]) > p.idle {
			idle = append(idle, c)
			delete(p.conns, k)
			delete(p.used, k)
			for ep, ck := range p.current {
				if ck == k {
					delete(p.current, ep)
				}
			}
		}
	}
	p.mu.Unlock()
	for _, c := range idle {
		p.log(ctx).V(1).Info("closing an idle libvirt connection")
		c.link.retire("idle")
	}
}

// size is how many connections are pooled (for tests).
func (p *connPool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *connPool) live(key string) *conn {
	p.mu.Lock()
	c := p.conns[key]
	if c != nil {
		p.used[key] = p.now()
	}
	p.mu.Unlock()
	if c != nil && c.link.usable() {
		return c
	}
	return nil
}

func (p *connPool) drop(key string, l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[key]; c != nil && c.link == l {
		delete(p.conns, key)
		delete(p.used, key)
	}
}

// close closes every pooled connection.
func (p *connPool) close() {
	p.mu.Lock()
	cs := make([]*conn, 0, len(p.conns))
	for _, c := range p.conns {
		cs = append(cs, c)
	}
	p.conns = map[string]*conn{}
	p.mu.Unlock()
	for _, c := range cs {
		c.link.close("pool closed")
	}
}
