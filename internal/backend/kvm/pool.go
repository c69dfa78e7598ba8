package kvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Target is one host with the credentials to reach it.
type Target struct {
	Host  Host
	Creds Credentials
	// Guard dials a tenant's host (netguard); nil for the platform's.
	Guard *netguard.Guard
	// Config names the config the target is of (Config.Name): a credential
	// change retires that config's connection, never another config's.
	Config string
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
// It bounds itself (the dial budget) and ends when ctx does.
type dialFunc func(ctx context.Context, t Target) (*conn, error)

// connPool holds one pooled connection per host and credentials. Callers
// for one key share one dial and its result, error included; a dial that
// failed after waiting on its host is answered from memory for
// failedDialMemory. A connection that closed or was retired is replaced on
// the next get; when one config's credentials for an endpoint change, the
// connection it built from the old ones is retired (its running calls
// finish) and the next get dials with the new ones.
type connPool struct {
	dial   dialFunc
	tracer trace.Tracer
	log    func(context.Context) logr.Logger

	mu    sync.Mutex
	conns map[string]*conn // by Target.key
	// current is the key each config last dialled an endpoint with, by
	// config and endpoint: other configs' connections to the same host are
	// not theirs to retire.
	current map[string]string
	used    map[string]time.Time
	dialing map[string]*dialCall   // by Target.key
	failed  map[string]*failedDial // by Target.key
	// idle is how long a connection no call asked for is kept (its
	// config is gone, or its host or credentials changed).
	idle time.Duration
	now  func() time.Time

	// ctx ends the dials in flight when the pool closes.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// connIdle is connPool.idle by default.
const connIdle = 10 * time.Minute

// failedDialMemory is how long a dial that failed after waiting on its
// host is answered from memory: about the dial budget, so that a host that
// never answers holds one reconcile worker per window, not every worker
// whose proxies are on it.
const failedDialMemory = 10 * time.Second

// slowDial is how long a failed dial must have waited to be remembered
// (one that ran out of time always is): a quick refusal costs nothing to
// retry, and a host that comes back is then used at once.
const slowDial = time.Second

// dialCall is one dial in flight; its result is every waiter's.
type dialCall struct {
	done chan struct{}
	c    *conn
	err  error
}

// failedDial is a failed dial answered from memory until retry.
type failedDial struct {
	err       error // classified, as the dial's waiters got it
	at, retry time.Time
	timeout   bool
}

func newConnPool(dial dialFunc, tracer trace.Tracer, log func(context.Context) logr.Logger) *connPool {
	p := &connPool{dial: dial, tracer: tracer, log: log, conns: map[string]*conn{}, current: map[string]string{}, used: map[string]time.Time{},
		dialing: map[string]*dialCall{}, failed: map[string]*failedDial{}, idle: connIdle, now: time.Now}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// get returns the pooled connection for t, dialling it when there is none.
// It waits for the dial no longer than ctx allows; the dial itself runs to
// its own budget, and its connection is pooled for the next get even when
// every caller gave up.
func (p *connPool) get(ctx context.Context, t Target) (Libvirt, error) {
	key := t.key()
	p.evictIdle(ctx, key)
	if c := p.live(key); c != nil {
		return c.api, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, classify("", err)
	}
	p.mu.Lock()
	if p.ctx.Err() != nil {
		p.mu.Unlock()
		return nil, proxy.Transientf("libvirt host %s: the provider is shutting down", t.Host.Name)
	}
	if c := p.conns[key]; c != nil && c.link.usable() {
		// Pooled since live looked.
		p.used[key] = p.now()
		p.mu.Unlock()
		return c.api, nil
	}
	if f := p.failed[key]; f != nil {
		if now := p.now(); now.Before(f.retry) {
			p.mu.Unlock()
			return nil, f.error(t.Host.Name, now)
		}
		delete(p.failed, key)
	}
	d := p.dialing[key]
	if d == nil {
		d = &dialCall{done: make(chan struct{})}
		p.dialing[key] = d
		p.wg.Add(1)
		go p.dialFor(ctx, key, t, d)
	}
	p.mu.Unlock()
	select {
	case <-d.done:
		if d.err != nil {
			return nil, d.err
		}
		return d.c.api, nil
	case <-ctx.Done():
		return nil, classify("", fmt.Errorf("waiting for the connection to libvirt host %s: %w", t.Host.Name, ctx.Err()))
	}
}

// dialFor makes d's dial, pools its connection or remembers its failure,
// and hands the result to d's waiters. The dial keeps what ctx carries (the
// logger, the span) but not its cancellation: it is every waiter's.
func (p *connPool) dialFor(ctx context.Context, key string, t Target, d *dialCall) {
	defer p.wg.Done()
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()
	start := p.now()
	c, err := p.fresh(ctx, t)
	closed := p.ctx.Err() != nil

	var retire *conn
	p.mu.Lock()
	delete(p.dialing, key)
	switch {
	case err != nil:
		f := &failedDial{err: err, at: start, timeout: timedOut(err)}
		if !closed && (f.timeout || p.now().Sub(start) >= slowDial) {
			f.retry = p.now().Add(failedDialMemory)
			p.failed[key] = f
		}
	case closed:
		err = proxy.Transientf("libvirt host %s: the provider is shutting down", t.Host.Name)
	default:
		c.link.setOnRetire(func(l *link) { p.drop(key, l) })
		p.conns[key] = c
		p.used[key] = p.now()
		delete(p.failed, key)
		cur := t.Config + "\x00" + t.endpoint()
		if old := p.current[cur]; old != "" && old != key {
			retire = p.conns[old]
			delete(p.conns, old)
		}
		p.current[cur] = key
	}
	d.c, d.err = c, err
	p.mu.Unlock()
	close(d.done)

	if err != nil {
		if c != nil {
			c.link.close("pool closed") // dialled while the pool closed
		}
		return
	}
	if retire != nil {
		p.log(ctx).WithValues(onHost(ctx, t.Host.Name)...).V(1).Info("credentials changed; retiring the connection built from the old ones")
		retire.link.retire("credentials changed")
	}
	p.log(ctx).WithValues(onHost(ctx, t.Host.Name)...).V(1).Info("libvirt host connected", "address", t.Host.Address)
}

// timedOut reports whether err is the host not answering in time.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// error is f as a caller gets it at now: its class and reason, the time of
// the next dial (as RetryAfter too), and the dial's own error, which holds
// nothing secret.
func (f *failedDial) error(host string, now time.Time) error {
	what := "libvirt host " + host
	if f.timeout {
		what += " did not answer"
	}
	e := &proxy.Error{Class: proxy.ClassOf(f.err), RetryAfter: f.retry.Sub(now),
		Err: fmt.Errorf("%s: the dial at %s failed and is tried again after %s: %w", what,
			f.at.UTC().Format(time.RFC3339), f.retry.UTC().Format(time.RFC3339), f.err)}
	var pe *proxy.Error
	if errors.As(f.err, &pe) {
		e.Reason = pe.Reason
	}
	return e
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
// for within p.idle: their calls in flight finish, then they close. It
// forgets the failed dials past their time.
func (p *connPool) evictIdle(ctx context.Context, keep string) {
	p.mu.Lock()
	for k, f := range p.failed {
		if !p.now().Before(f.retry) {
			delete(p.failed, k)
		}
	}
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

// close ends the dials in flight and closes every pooled connection.
func (p *connPool) close() {
	p.mu.Lock()
	p.cancel()
	p.mu.Unlock()
	p.wg.Wait()
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
