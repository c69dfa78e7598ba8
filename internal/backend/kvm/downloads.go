package kvm

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// platformImages owns the downloads of the platform's catalogue images:
// their servers are the platform team's.
const platformImages = ""

// downloadOwner is whose share of a host's download slots img takes: the
// platform's for its catalogue images, otherwise the namespace of the
// proxy that asked (a namespaced config's images, or an image URL a proxy
// names), or, for a cluster-scoped proxy's image URL, those proxies'.
func downloadOwner(ctx context.Context, img resolvedImage) string {
	if img.guard == nil {
		return platformImages
	}
	if ns := proxy.TenantOf(ctx); ns != "" {
		return "namespace " + ns
	}
	return "cluster-scoped proxies"
}

// slots bounds the image downloads running per host, shared so that a
// tenant's slow image server cannot keep another's images waiting: each
// owner other than the platform runs at most half of the host's limit
// (at least one), all of them together the limit, and the platform's
// catalogue images may take one slot besides, so that they never wait
// for tenants' alone. Waiters take freed slots in arrival order, each as
// its owner's share allows.
type slots struct {
	mu    sync.Mutex
	hosts map[string]*hostSlots
}

// hostSlots are one host's downloads running and waiting.
type hostSlots struct {
	running  int
	platform int
	owners   map[string]int
	waiting  []*slotWaiter
}

// slotWaiter is an acquire waiting for a slot, under its config's limit.
type slotWaiter struct {
	owner   string
	limit   int
	granted chan struct{}
}

func newSlots() *slots { return &slots{hosts: map[string]*hostSlots{}} }

// allows reports whether owner may start a download under limit.
func (h *hostSlots) allows(owner string, limit int) bool {
	if owner == platformImages {
		return h.running < limit || h.platform == 0
	}
	// The slot besides the limit is the platform's.
	total := limit
	if h.platform > 0 {
		total++
	}
	return h.running-h.platform < limit && h.running < total && h.owners[owner] < max(1, limit/2)
}

func (h *hostSlots) take(owner string) {
	h.running++
	if owner == platformImages {
		h.platform++
		return
	}
	h.owners[owner]++
}

// acquire waits for a slot of owner on host key, within limit, or for
// ctx to end.
func (s *slots) acquire(ctx context.Context, key, owner string, limit int) error {
	s.mu.Lock()
	h := s.hosts[key]
	if h == nil {
		h = &hostSlots{owners: map[string]int{}}
		s.hosts[key] = h
	}
	if h.allows(owner, limit) {
		h.take(owner)
		s.mu.Unlock()
		return nil
	}
	w := &slotWaiter{owner: owner, limit: limit, granted: make(chan struct{})}
	h.waiting = append(h.waiting, w)
	s.mu.Unlock()
	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-w.granted:
		// Granted as ctx ended: passed on to the next.
		s.releaseLocked(key, owner)
	default:
		h.waiting = slices.DeleteFunc(h.waiting, func(o *slotWaiter) bool { return o == w })
		s.forget(key, h)
	}
	return ctx.Err()
}

// release ends a download of owner on host key.
func (s *slots) release(key, owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(key, owner)
}

func (s *slots) releaseLocked(key, owner string) {
	h := s.hosts[key]
	if h == nil {
		return
	}
	h.running--
	if owner == platformImages {
		h.platform--
	} else if h.owners[owner]--; h.owners[owner] <= 0 {
		delete(h.owners, owner)
	}
	h.waiting = slices.DeleteFunc(h.waiting, func(w *slotWaiter) bool {
		if !h.allows(w.owner, w.limit) {
			return false
		}
		h.take(w.owner)
		close(w.granted)
		return true
	})
	s.forget(key, h)
}

// forget drops a host without downloads: nothing is kept for it.
func (s *slots) forget(key string, h *hostSlots) {
	if h.running <= 0 && len(h.waiting) == 0 {
		delete(s.hosts, key)
	}
}

// errImageIdle is the cause of a download cut off by its idleWatch.
var errImageIdle = errors.New("the image server sent nothing in time")

// idleWatch cancels a download whose server sends nothing for idle while
// the download waits on it (the headers, the next bytes); time spent on
// the host's side (a slow pool) does not count.
type idleWatch struct {
	idle   time.Duration
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
}

// newIdleWatch returns the context of the download's request, and its
// watch.
func newIdleWatch(ctx context.Context, idle time.Duration) (context.Context, *idleWatch) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &idleWatch{idle: idle, ctx: ctx, cancel: cancel}
	w.timer = time.AfterFunc(idle, func() { cancel(errImageIdle) })
	w.timer.Stop()
	return ctx, w
}

// wait starts a wait on the server; got ends it.
func (w *idleWatch) wait() { w.timer.Reset(w.idle) }
func (w *idleWatch) got()  { w.timer.Stop() }

// stop ends the watch and its context.
func (w *idleWatch) stop() {
	w.timer.Stop()
	w.cancel(nil)
}

// err is the error of img's download when the watch cut it off, nil
// otherwise. It names the image as label does: never the URL's query or
// user info.
func (w *idleWatch) err(img resolvedImage) error {
	if !errors.Is(context.Cause(w.ctx), errImageIdle) {
		return nil
	}
	return proxy.Transientf("image %s: its server sent nothing for %s, so the download was stopped (a silent download would hold one of the host's download slots); is the server up and sending?", img.label(), w.idle)
}

// reader is body with every read watched.
func (w *idleWatch) reader(body io.ReadCloser) io.ReadCloser {
	return &watchedBody{ReadCloser: body, w: w}
}

type watchedBody struct {
	io.ReadCloser
	w *idleWatch
}

func (b *watchedBody) Read(p []byte) (int, error) {
	b.w.wait()
	defer b.w.got()
	return b.ReadCloser.Read(p)
}
