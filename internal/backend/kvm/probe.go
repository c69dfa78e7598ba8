package kvm

import (
	"bufio"
	"context"
	"net"
	"strings"
	"sync"
	"time"
)

// ProbeFunc reports whether the proxy at addr (ip:port) answers.
type ProbeFunc func(ctx context.Context, addr string) bool

// squidIdentity is the header line a Squid running internal/squid's
// config puts on its own answers (visible_hostname egress-proxy). A Squid
// with the image's default config (named after the machine) does not, so
// a proxy is not taken as ready before its own config is in place.
const squidIdentity = "x-cache: miss from egress-proxy"

// probeHTTP connects and sends a request Squid answers itself (an invalid
// URL is answered with an error page, never forwarded), so it proves that
// Squid with the provider's config is serving, not just that a port is
// open, and sends no traffic anywhere.
func probeHTTP(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer func() { _ = c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		return false
	}
	r := bufio.NewReader(c)
	status, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(status, "HTTP/") {
		return false
	}
	for range 64 {
		line, err := r.ReadString('\n')
		line = strings.ToLower(strings.TrimSpace(line))
		if err != nil || line == "" {
			return false
		}
		if line == squidIdentity {
			return true
		}
	}
	return false
}

// prober caches probe results per address and never holds a caller for a
// slow probe: a probe that does not answer within wait finishes in the
// background and its result is there at the next poll.
type prober struct {
	probe       ProbeFunc
	wait        time.Duration
	positiveTTL time.Duration
	negativeTTL time.Duration

	mu      sync.Mutex
	entries map[string]*probeEntry
}

type probeEntry struct {
	done chan struct{}
	ok   bool
	at   time.Time
}

func newProber(p ProbeFunc) *prober {
	if p == nil {
		p = probeHTTP
	}
	return &prober{probe: p, wait: 300 * time.Millisecond, positiveTTL: 30 * time.Second, negativeTTL: 2 * time.Second, entries: map[string]*probeEntry{}}
}

// reachable reports whether addr answered recently, probing when the last
// answer is stale.
func (p *prober) reachable(ctx context.Context, addr string) bool {
	p.mu.Lock()
	e := p.entries[addr]
	if e != nil {
		select {
		case <-e.done:
			ttl := p.negativeTTL
			if e.ok {
				ttl = p.positiveTTL
			}
			if time.Since(e.at) >= ttl {
				e = nil
			}
		default:
		}
	}
	if e == nil {
		e = &probeEntry{done: make(chan struct{})}
		p.entries[addr] = e
		if len(p.entries) > 4096 {
			p.sweep()
		}
		go func() {
			ok := p.probe(context.WithoutCancel(ctx), addr)
			p.mu.Lock()
			e.ok, e.at = ok, time.Now()
			p.mu.Unlock()
			close(e.done)
		}()
	}
	p.mu.Unlock()
	select {
	case <-e.done:
	case <-time.After(p.wait):
		return false
	case <-ctx.Done():
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return e.ok
}

// sweep drops finished entries older than the longest TTL; p.mu held.
func (p *prober) sweep() {
	for k, e := range p.entries {
		select {
		case <-e.done:
			if time.Since(e.at) > p.positiveTTL {
				delete(p.entries, k)
			}
		default:
		}
	}
}
