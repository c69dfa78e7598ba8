package squid

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// identityPrefix starts the visible_hostname of every rendered config.
const identityPrefix = "egress-proxy"

// Identity is the name Squid running the configuration rendered for the
// managed resource uid calls itself (its visible_hostname): it is on every
// answer Squid makes itself, in the X-Cache header ("MISS from <name>")
// and on its error pages, so a probe tells this resource's Squid from the
// image's default one and from another resource's. uid is not secret.
func Identity(uid string) string {
	if uid == "" {
		return identityPrefix
	}
	return identityPrefix + "-" + strings.ToLower(uid)
}

// AnySquid is the identity a Check expects of an instance without the
// provider's ownership mark, which only an Observe-only import reads (the
// provider adopts no unmarked instance otherwise): its Squid runs a
// configuration the provider did not render, and calls itself what its
// owner chose, so any Squid's answer serves. No visible_hostname is "*".
const AnySquid = "*"

// Expected is the identity a Check of the instance marked m expects: its
// resource's (Identity of m.UID), or AnySquid for an unmarked instance.
// A marked instance's check is never loosened.
func Expected(m proxy.Mark) string {
	if m == (proxy.Mark{}) {
		return AnySquid
	}
	return Identity(m.UID)
}

// IdentityOf is the visible_hostname of a squid.conf, "" when it has none:
// what a Squid started from it says it is (fakes of the backends answer
// probes with it).
func IdentityOf(squidConf string) string {
	for _, l := range strings.Split(squidConf, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "visible_hostname" {
			return f[1]
		}
	}
	return ""
}

// Guard checks and dials the addresses a backend reports for a proxy
// (netguard.Guard): for a namespaced ProviderConfig the backend is the
// tenant's, and so is what it reports, as is what a guest a tenant writes
// reports on the platform's config. A nil *netguard.Guard, the platform's
// own guests', checks nothing and dials plainly.
type Guard interface {
	// CheckHost returns an error when host must not be connected to.
	CheckHost(ctx context.Context, host string) ([]netip.Addr, error)
	// DialContext connects, checking the address it connects to.
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// checkReported checks addr, an address a backend reported, with g: the
// error names it as the backend's and says why it is refused.
func checkReported(ctx context.Context, g Guard, addr string) error {
	if g == nil {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if _, err := g.CheckHost(ctx, host); err != nil {
		return &ReportedRefusedError{Addr: addr, Err: err}
	}
	return nil
}

// ReportedRefusedError is an address a tenant's backend reported for a
// proxy, which the provider does not connect to.
type ReportedRefusedError struct {
	// Addr is the address as the backend reported it.
	Addr string
	// Err is the guard's refusal.
	Err error
}

func (e *ReportedRefusedError) Error() string {
	return fmt.Sprintf("the backend reports the proxy's address as %s, and %v", e.Addr, e.Err)
}

func (e *ReportedRefusedError) Unwrap() error { return e.Err }

// identityPattern is what a visible_hostname of the provider's looks
// like; another name is not quoted (an answer is quoted only when it is
// one of the provider's own names, or an unmarked instance's Answer
// within shownName).
var identityPattern = regexp.MustCompile(`^` + identityPrefix + `(-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})?$`)

// shownName is a name another Squid answered with that a Probe's Answer may
// quote: a plain host name, bounded, with nothing a sentence is made of.
var shownName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Ask connects to addr and sends a request Squid answers itself (an
// invalid URL gets an error page, never forwarded: no traffic leaves the
// proxy, and no credentials are needed or sent), and returns the name in
// the answer's X-Cache header: the visible_hostname of the configuration
// Squid runs. An answer without one (something else on the port) is an
// error.
func Ask(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string) (string, error) {
	return AskTLS(ctx, dial, addr, "")
}

// AskTLS is Ask of a proxy listening with TLS when ca (PEM) is set: the
// request goes inside a TLS connection whose certificate chain verifies
// against ca (ClientTLS). With ca empty it is Ask.
func AskTLS(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr, ca string) (string, error) {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if ca != "" {
		cfg, err := ClientTLS(ca)
		if err != nil {
			return "", &plainError{err: err}
		}
		tc := tls.Client(c, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return "", &handshakeError{addr: addr, err: err}
		}
		c = tc
	}
	if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		return "", err
	}
	// Whatever answers at addr may send a line that never ends.
	r := bufio.NewReader(io.LimitReader(c, maxAnswerHead))
	status, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(status, "HTTP/") {
		return "", &plainError{err: fmt.Errorf("%s does not answer HTTP", addr)}
	}
	for range 64 {
		line, err := r.ReadString('\n')
		line = strings.TrimSpace(line)
		if err != nil || line == "" {
			break
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || !strings.EqualFold(name, "X-Cache") {
			continue
		}
		// "MISS from egress-proxy-<uid>"
		if i := strings.LastIndex(strings.ToLower(value), " from "); i >= 0 {
			return strings.TrimSpace(value[i+len(" from "):]), nil
		}
	}
	return "", &plainError{err: fmt.Errorf("%s answers HTTP, but not as Squid", addr)}
}

// maxAnswerHead is the most of an answer Ask reads: a status line and 64
// header lines. Squid's whole answer head is under 2 KiB.
const maxAnswerHead = 16 << 10

// plainError is an error of the probe in its own words, quoting nothing
// the endpoint answered: a failed dial (the guard's refusal, a lookup, a
// connect), an answer that is not HTTP or not Squid's.
type plainError struct{ err error }

func (e *plainError) Error() string { return e.err.Error() }
func (e *plainError) Unwrap() error { return e.err }

// handshakeError is a TLS handshake with the proxy at addr that failed.
type handshakeError struct {
	addr string
	err  error
}

func (e *handshakeError) Error() string { return fmt.Sprintf("TLS with %s: %v", e.addr, e.err) }
func (e *handshakeError) Unwrap() error { return e.err }

// quiet is err, an error of the probe of an address a tenant's backend
// reported, saying nothing the endpoint answered: what answers there is
// whatever the tenant's backend pointed the provider at (any host in a
// range the platform team allows for tenants), and it chose its
// certificate's names, its TLS alerts and its bytes. A certificate that
// does not verify is said in fixed words; errors in the probe's own words
// and timeouts are kept; anything else is unquoted, as the egress check's.
func quiet(err error) error {
	var ce *certError
	var pe *plainError
	var he *handshakeError
	switch {
	case errors.As(err, &ce):
		return errors.New(certNotVerified)
	case errors.Is(err, errNoCert), errors.As(err, &pe),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return err
	case errors.As(err, &he):
		return fmt.Errorf("TLS with %s failed (what it answered is not shown to tenants)", he.addr)
	}
	return unquoted(err)
}

// Probe is what a Prober knows of a proxy.
type Probe struct {
	// Serving: Squid with the expected configuration answered.
	Serving bool
	// Pending: the first probe has not finished yet.
	Pending bool
	// Message says, when not Serving, what was found ("no answer from
	// 10.0.0.5:3128: connection refused", "... answers as egress-proxy,
	// not as egress-proxy-<uid>"); empty while Pending. Of a probe with a
	// guard (an address a tenant's backend reported) it quotes nothing
	// that answered there: no certificate's names, no TLS alert, no bytes.
	Message string
	// Refused: the guard refused the address (Message says why); nothing
	// was sent there.
	Refused bool
	// Answer says, of a Check of AnySquid that found Squid serving, what
	// the Squid answered as: `answered as "<name>"` when the name is one
	// of the provider's, or a plain host name of at most 63 characters and
	// the probe has no guard (a platform's config); otherwise that it
	// answered, the name not shown (with a guard the probe quotes nothing
	// the address answered). Empty for any other Check.
	Answer string
}

// DetailAnswer is the proxy.Instance Details key under which a driver
// reports the Answer of an unmarked instance's probe (NoteAnswer).
const DetailAnswer = "squidAnswer"

// NoteAnswer records pr.Answer, when there is one, in inst's Details.
func NoteAnswer(inst *proxy.Instance, pr Probe) {
	if pr.Answer == "" {
		return
	}
	if inst.Details == nil {
		inst.Details = map[string]string{}
	}
	inst.Details[DetailAnswer] = pr.Answer
}

// Prober tells whether Squid with a resource's own configuration (for an
// unmarked instance, any Squid: AnySquid) answers at an address, for a
// backend's Get. It is the one readiness check of
// every backend, built to stay cheap with a thousand proxies:
//
//   - Results are kept per key (the caller's: an instance's name or pod
//     UID), address and identity: a success for PositiveTTL, anything
//     else for NegativeTTL.
//   - Concurrent checks of one key share one probe.
//   - A check waits at most Wait. A slower probe (an address the provider
//     cannot route to times out) finishes in the background and calls
//     Notify, so the caller can reconcile again at once, and no reconcile
//     worker is held for a probe's timeout. While a result that found Squid
//     serving is being renewed, a check that cannot wait answers it (a
//     Ready proxy does not flap over a slow link); a failure of the renewal
//     is the answer of the next check.
//
// A Prober is safe for concurrent use; the zero value uses the defaults.
type Prober struct {
	// Ask returns the identity the proxy at addr answers with (see Ask);
	// default AskTLS over Dial, with the check's CA. Fakes of a backend
	// answer with the visible_hostname of the squid.conf they were given,
	// and are not told the CA.
	Ask func(ctx context.Context, addr string) (string, error)
	// Dial connects for the default Ask; default net.Dialer.DialContext.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Timeout of one probe; default 2 s.
	Timeout time.Duration
	// Wait is how long a check waits for a probe before answering
	// Pending; default 250 ms.
	Wait time.Duration
	// PositiveTTL and NegativeTTL are how long results are kept; defaults
	// 30 s and 3 s.
	PositiveTTL, NegativeTTL time.Duration
	// Notify, when set, is called with the key of a check whose probe
	// finished after Wait.
	Notify func(key string)

	mu      sync.Mutex
	entries map[string]*probeEntry
	sweeps  int
}

type probeEntry struct {
	addr, identity string
	ca             string // the CA's digest; "" without TLS
	caPEM          string
	done           chan struct{} // closed when the probe finished
	result         Probe
	at             time.Time
	waiters        bool // someone gave up waiting: Notify on completion
	// served: the last probe before this one, of the same address and
	// identity, found Squid serving. A check that cannot wait for this one
	// answers that, so a Ready proxy does not turn not-Ready for a moment
	// each time its result is renewed over a slow link.
	served bool
	// answer is that probe's Answer, said with it.
	answer string
	// guard the probe dialled with: its result answers no caller whose
	// guard differs (a tenant's backend reporting a platform proxy's
	// address).
	guard Guard
}

// Check reports whether Squid answering as identity (Identity of the
// resource's UID; AnySquid, from Expected, for an unmarked instance: any
// Squid's answer) serves at addr, for the caller's key. guard, when not
// nil, checks addr first and dials it (the config's netguard.Guard):
// an address it refuses is never asked, whatever Ask is. ca, when set, is
// the PEM CA of a proxy listening with TLS (proxy.Ref.ProxyCA): the probe
// speaks TLS and verifies the proxy's certificate against it. With a
// guard, the result's Message quotes nothing the address answered (quiet).
func (p *Prober) Check(ctx context.Context, guard Guard, key, addr, identity, ca string) Probe {
	caDigest := ""
	if ca != "" {
		sum := sha256.Sum256([]byte(ca))
		caDigest = string(sum[:])
	}
	p.mu.Lock()
	if p.entries == nil {
		p.entries = map[string]*probeEntry{}
	}
	e := p.entries[key]
	now := time.Now()
	served, answer := false, ""
	if e != nil && e.addr == addr && e.identity == identity && e.ca == caDigest && e.guard == guard {
		select {
		case <-e.done:
			if now.Sub(e.at) < p.ttl(e.result.Serving) {
				p.mu.Unlock()
				return e.result
			}
			served, answer = e.result.Serving, e.result.Answer
			e = nil // expired
		default: // in flight
		}
	} else {
		e = nil
	}
	if e == nil {
		e = &probeEntry{addr: addr, identity: identity, ca: caDigest, caPEM: ca, done: make(chan struct{}), served: served, answer: answer, guard: guard}
		p.entries[key] = e
		p.sweep(now)
		go p.probe(key, e, guard) //nolint:gosec // The probe outlives the request that started it: later checks share its result.
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
	case <-t.C:
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-e.done:
		return e.result
	default:
		e.waiters = true
		if e.served {
			return Probe{Serving: true, Answer: e.answer}
		}
		return Probe{Pending: true}
	}
}

// Forget drops what is known of key (an instance that is gone).
func (p *Prober) Forget(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.entries, key)
}

func (p *Prober) probe(key string, e *probeEntry, guard Guard) {
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dial := p.Dial
	if guard != nil {
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := guard.DialContext(ctx, network, addr)
			if err != nil {
				// Said before anything was answered.
				return nil, &plainError{err: err}
			}
			return c, nil
		}
	}
	ask := p.Ask
	if ask == nil {
		ask = func(ctx context.Context, addr string) (string, error) { return AskTLS(ctx, dial, addr, e.caPEM) }
	}
	var r Probe
	if err := checkReported(ctx, guard, e.addr); err != nil {
		r.Refused, r.Message = true, err.Error()
	} else {
		got, err := ask(ctx, e.addr)
		switch {
		case err != nil:
			if guard != nil {
				// A tenant's backend reported the address.
				err = quiet(err)
			}
			r.Message = fmt.Sprintf("no answer from Squid at %s: %v", e.addr, err)
		case e.identity == AnySquid:
			r.Serving, r.Answer = true, answered(got, guard != nil)
		case got != e.identity && identityPattern.MatchString(got):
			r.Message = fmt.Sprintf("Squid at %s answers as %q, not as this resource's (%q): its configuration is another one", e.addr, got, e.identity)
		case got != e.identity:
			// Not quoted: whatever answers there chose the name.
			r.Message = fmt.Sprintf("Squid at %s answers with a name that is not one of the provider's, not as this resource's (%q)", e.addr, e.identity)
		default:
			r.Serving = true
		}
	}
	p.mu.Lock()
	e.result, e.at = r, time.Now()
	close(e.done)
	notify := e.waiters && p.Notify != nil
	p.mu.Unlock()
	if notify {
		p.Notify(key)
	}
}

// answered is a Probe's Answer of a Squid that answered as name, for a
// check of AnySquid; guarded: the address is one a tenant's backend
// reported, whose answers are never quoted.
func answered(name string, guarded bool) string {
	switch {
	case identityPattern.MatchString(name):
		// One of the provider's own names, quoted as Check quotes it.
		return fmt.Sprintf("answered as %q", name)
	case guarded:
		return "answered (its name is not shown to tenants)"
	case !shownName.MatchString(name):
		return "answered (with a name that is not a plain host name: not shown)"
	default:
		return fmt.Sprintf("answered as %q", name)
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

// sweep drops expired entries now and then, so instances that are gone
// do not stay forever. Called with mu held.
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

// AnswerProbes answers every connection to ln as Squid named identity
// answers a probe (a 400 with its X-Cache header), until ln is closed:
// the stand-in for a guest's or a pod's Squid in the backends' fakes.
func AnswerProbes(ln net.Listener, identity string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer func() { _ = c.Close() }()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 512)
			_, _ = c.Read(buf)
			_, _ = fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\nServer: squid\r\nX-Cache: MISS from %s\r\nConnection: close\r\n\r\n", identity)
		}()
	}
}
