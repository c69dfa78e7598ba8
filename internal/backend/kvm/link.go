package kvm

import (
	"context"
	"sync"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Budgets bound each kind of backend call. A call that runs out of its
// budget (or whose ctx ends) is abandoned: its caller gets a Transient
// error at once.
type Budgets struct {
	// Dial bounds TCP connect, SSH handshake, socket channel and libvirt
	// connect together.
	Dial time.Duration
	// RPC bounds an ordinary call.
	RPC time.Duration
	// DomainCreate bounds starting a domain.
	DomainCreate time.Duration
	// SeedUpload bounds uploading a seed ISO.
	SeedUpload time.Duration
	// ImageUpload bounds downloading and uploading one base image.
	ImageUpload time.Duration
	// ImageIdle stops an image download whose server sends nothing for
	// this long while the provider waits on it (for the headers or the
	// next bytes), so that it does not hold a download slot of its host
	// for all of ImageUpload.
	ImageIdle time.Duration
	// Linger is how long a retired connection (one on which a call was
	// abandoned) stays open for the calls still running on it.
	Linger time.Duration
	// Keepalive is the SSH keepalive interval; a missed answer within the
	// same time drops the connection.
	Keepalive time.Duration
}

// DefaultBudgets are the spec's budgets.
var DefaultBudgets = Budgets{
	Dial:         10 * time.Second,
	RPC:          30 * time.Second,
	DomainCreate: 90 * time.Second,
	SeedUpload:   60 * time.Second,
	ImageUpload:  20 * time.Minute,
	ImageIdle:    time.Minute,
	Linger:       2 * time.Minute,
	Keepalive:    15 * time.Second,
}

func (b Budgets) withDefaults() Budgets {
	d := DefaultBudgets
	set := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&b.Dial, d.Dial)
	set(&b.RPC, d.RPC)
	set(&b.DomainCreate, d.DomainCreate)
	set(&b.SeedUpload, d.SeedUpload)
	set(&b.ImageUpload, d.ImageUpload)
	set(&b.ImageIdle, d.ImageIdle)
	set(&b.Linger, d.Linger)
	set(&b.Keepalive, d.Keepalive)
	return b
}

type budgetKey struct{}

// withBudget overrides the budget of the calls made with ctx (the image
// upload's is much longer than a seed's).
func withBudget(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, budgetKey{}, d)
}

func budgetOf(ctx context.Context, def time.Duration) time.Duration {
	if d, ok := ctx.Value(budgetKey{}).(time.Duration); ok && d > 0 {
		return d
	}
	return def
}

// link is one connection to a host's libvirt, shared by every caller.
//
// go-libvirt's calls take no ctx and block; the only way to stop one is to
// close the connection, which fails every other call on it too. So a call
// that is abandoned (its ctx ended or its budget ran out) does not close
// the link: it retires it. A retired link gets no new calls (the pool
// dials a fresh one), finishes the calls already running, and is closed
// once only abandoned calls remain, or after Linger at the latest. Other
// callers' work is never cut off by someone else's cancellation.
type link struct {
	closeFn func() error
	linger  time.Duration
	// onRetire tells the pool to stop handing the link out.
	onRetire func(*link)

	mu        sync.Mutex
	inflight  int
	abandoned int
	retired   bool
	closed    bool
	done      chan struct{}
	reason    string
}

func newLink(closeFn func() error, linger time.Duration) *link {
	return &link{closeFn: closeFn, linger: linger, done: make(chan struct{})}
}

func (l *link) setOnRetire(fn func(*link)) {
	l.mu.Lock()
	l.onRetire = fn
	l.mu.Unlock()
}

// usable reports whether new calls may start on the link.
func (l *link) usable() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.retired && !l.closed
}

// call runs fn on the link within budget. fn runs in its own goroutine;
// when ctx ends or the budget runs out first, the call is abandoned (fn
// keeps running until the link closes) and the error is Transient.
func (l *link) call(ctx context.Context, budget time.Duration, fn func() error) error {
	_, err := callValue(ctx, l, budget, func() (struct{}, error) { return struct{}{}, fn() })
	return err
}

// callValue is call for a function with a result. The result travels over
// a channel, so an abandoned call never writes into its caller's memory.
func callValue[T any](ctx context.Context, l *link, budget time.Duration, fn func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, proxy.Classify(proxy.ClassTransient, err)
	}
	l.mu.Lock()
	if l.closed {
		reason := l.reason
		l.mu.Unlock()
		return zero, proxy.Transientf("libvirt connection closed (%s)", reason)
	}
	l.inflight++
	l.mu.Unlock()

	type result struct {
		v   T
		err error
	}
	res := make(chan result, 1)
	abandoned := make(chan struct{})
	go func() {
		v, err := fn()
		res <- result{v, err}
		l.finish(abandoned)
	}()
	timer := time.NewTimer(budget)
	defer timer.Stop()
	select {
	case r := <-res:
		return r.v, r.err
	case <-ctx.Done():
		l.abandon(abandoned, "a call was abandoned: "+ctx.Err().Error())
		return zero, proxy.Classify(proxy.ClassTransient, ctx.Err())
	case <-timer.C:
		l.abandon(abandoned, "a call ran out of its budget")
		return zero, proxy.Transientf("libvirt call did not answer within %v: %w", budget, context.DeadlineExceeded)
	case <-l.done:
		// Closed under us (keepalive failed, libvirt went away): fn fails
		// too, but do not wait for it.
		return zero, proxy.Transientf("libvirt connection closed (%s)", l.closeReason())
	}
}

func (l *link) closeReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

// abandon records that the call owning flag gave up, and retires the link.
func (l *link) abandon(flag chan struct{}, reason string) {
	l.mu.Lock()
	select {
	case <-flag:
	default:
		close(flag)
		l.abandoned++
	}
	l.mu.Unlock()
	l.retire(reason)
}

// finish is called when a call's fn returned.
func (l *link) finish(flag chan struct{}) {
	l.mu.Lock()
	l.inflight--
	select {
	case <-flag:
		l.abandoned--
	default:
		close(flag) // a later abandon must not count this call
	}
	drained := l.retired && l.inflight-l.abandoned <= 0
	l.mu.Unlock()
	if drained {
		l.close("retired and drained")
	}
}

// retire stops new calls on the link and closes it once the calls still
// running (other than abandoned ones) finished, or after linger.
func (l *link) retire(reason string) {
	l.mu.Lock()
	if l.retired || l.closed {
		l.mu.Unlock()
		return
	}
	l.retired = true
	l.reason = reason
	drained := l.inflight-l.abandoned <= 0
	onRetire := l.onRetire
	l.mu.Unlock()
	if onRetire != nil {
		onRetire(l)
	}
	if drained {
		l.close(reason)
		return
	}
	time.AfterFunc(l.linger, func() { l.close("retired: linger expired") })
}

// close closes the connection now; every call on it fails.
func (l *link) close(reason string) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed, l.retired = true, true
	if l.reason == "" {
		l.reason = reason
	}
	onRetire := l.onRetire
	close(l.done)
	l.mu.Unlock()
	if onRetire != nil {
		onRetire(l)
	}
	if l.closeFn != nil {
		_ = l.closeFn()
	}
}
