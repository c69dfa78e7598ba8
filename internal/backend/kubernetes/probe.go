package kubernetes

import (
	"context"
	"net"
	"sync"
	"time"
)

// Prober checks that a proxy answers on its port: a TCP connect to the
// serving pod's address. It is built to stay cheap with a thousand proxies:
//
//   - Get asks only for a pod that is Ready (its kubelet's readiness probe
//     already connects to the same port), so a pod that is not costs
//     nothing.
//   - Results are kept per pod and address: a success for PositiveTTL (a
//     Ready pod that stops answering turns not-Ready through its readiness
//     probe, which Get sees first), a failure for NegativeTTL.
//   - Concurrent asks for one address share one dial.
//   - Get waits at most Wait for a dial. A slower one (an address the
//     provider cannot route to times out) finishes in the background and
//     calls Notify, so that the managed resource is reconciled again at
//     once instead of at its next poll, and no reconcile worker is held for
//     a dial timeout.
//
// A Prober is safe for concurrent use; the zero value uses the defaults.
type Prober struct {
	// Dial connects; default net.Dialer.DialContext.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Timeout of one dial; default 2 s.
	Timeout time.Duration
	// Wait is how long a check waits for a dial before answering "not yet";
	// default 250 ms.
	Wait time.Duration
	// PositiveTTL and NegativeTTL are how long results are kept; defaults
	// 30 s and 3 s.
	PositiveTTL, NegativeTTL time.Duration
	// Notify, when set, is called with the key of a check whose dial
	// finished after Wait.
	Notify func(key string)

	mu      sync.Mutex
	entries map[string]*probeEntry
	sweeps  int
}

type probeEntry struct {
	addr    string
	done    chan struct{} // closed when the dial finished
	ok      bool
	at      time.Time
	waiters bool // someone gave up waiting: Notify on completion
}

// Reachable reports whether addr answered, for the check identified by key
// (the caller's: a pod UID plus whatever it needs Notify to receive).
// pending is true when the answer is not known yet.
func (p *Prober) Reachable(ctx context.Context, key, addr string) (ok, pending bool) {
	p.mu.Lock()
	if p.entries == nil {
		p.entries = map[string]*probeEntry{}
	}
	e := p.entries[key]
	now := time.Now()
	if e != nil && e.addr == addr {
		select {
		case <-e.done:
			ttl := p.ttl(e.ok)
			if now.Sub(e.at) < ttl {
				p.mu.Unlock()
				return e.ok, false
			}
			e = nil // expired
		default: // in flight
		}
	} else {
		e = nil
	}
	if e == nil {
		e = &probeEntry{addr: addr, done: make(chan struct{})}
		p.entries[key] = e
		p.sweep(now)
		go p.dial(key, e) //nolint:gosec // The probe outlives the request that started it: later requests share its result.
	}
	p.mu.Unlock()

	wait := p.Wait
	if wait <= 0 {
		wait = 250 * time.Millisecond
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-e.done:
		return e.ok, false
	case <-t.C:
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-e.done:
		return e.ok, false
	default:
		e.waiters = true
		return false, true
	}
}

func (p *Prober) dial(key string, e *probeEntry) {
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dial := p.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	c, err := dial(ctx, "tcp", e.addr)
	if err == nil {
		_ = c.Close()
	}
	p.mu.Lock()
	e.ok, e.at = err == nil, time.Now()
	close(e.done)
	notify := e.waiters && p.Notify != nil
	p.mu.Unlock()
	if notify {
		p.Notify(key)
	}
}

func (p *Prober) ttl(ok bool) time.Duration {
	if ok {
		if p.PositiveTTL > 0 {
			return p.PositiveTTL
		}
		return 30 * time.Second
	}
	if p.NegativeTTL > 0 {
		return p.NegativeTTL
	}
	return 3 * time.Second
}

// sweep drops expired entries now and then, so pods that are gone do not
// stay forever. Called with mu held.
func (p *Prober) sweep(now time.Time) {
	p.sweeps++
	if p.sweeps < 256 {
		return
	}
	p.sweeps = 0
	for k, e := range p.entries {
		select {
		case <-e.done:
			if now.Sub(e.at) >= p.ttl(true) {
				delete(p.entries, k)
			}
		default:
		}
	}
}
