package external

import (
	"context"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// DefaultQuotaRetryInterval is how long a proxy whose backend is out of
// quota or capacity waits before the next attempt, unless configured.
const DefaultQuotaRetryInterval = 5 * time.Minute

// retryHints carry, from the external client to the reconciler wrapped
// around crossplane-runtime's (retryAfter), how long the resource a
// reconcile just failed on should wait: crossplane-runtime requeues every
// failed reconcile through the controller's exponential backoff (1s
// doubling up to 60s), which retries an exhausted quota every minute for
// ever and ignores a backend's Retry-After. One set per kind; keys are the
// resources' namespaced names (cluster-scoped ones have no namespace, so
// the two scopes of a kind cannot collide).
type retryHints struct {
	mu    sync.Mutex
	after map[types.NamespacedName]time.Duration
	// soon holds, for a reconcile that succeeded, how soon at most the
	// resource should be looked at again (noteSoon).
	soon map[types.NamespacedName]time.Duration
	// quota is the wait after a Quota error (Options.QuotaRetryInterval).
	quota time.Duration
}

func newRetryHints(quota time.Duration) *retryHints {
	if quota <= 0 {
		quota = DefaultQuotaRetryInterval
	}
	return &retryHints{after: map[types.NamespacedName]time.Duration{}, soon: map[types.NamespacedName]time.Duration{}, quota: quota}
}

// wait is how long the resource should wait after err: the quota
// interval for a Quota error, at least the backend's Retry-After, 0 for
// the runtime's own backoff.
func (h *retryHints) wait(err error) time.Duration {
	if h == nil || err == nil {
		return 0
	}
	d := proxy.RetryAfterOf(err)
	if proxy.IsQuota(err) {
		d = max(d, h.quota)
	}
	return d
}

// note records that mg's reconcile failed with err.
func (h *retryHints) note(mg resource.Managed, err error) {
	d := h.wait(err)
	if d <= 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.after[types.NamespacedName{Namespace: mg.GetNamespace(), Name: mg.GetName()}] = d
}

// noteSoon records that mg should be looked at again within d, sooner
// than its poll: its instance has an address and its proxy does not
// answer yet (a guest finishing its boot), so the moment it answers is
// seen within d rather than at the next not-Ready poll; or its egress
// check is due. The shortest of a reconcile's notes counts.
func (h *retryHints) noteSoon(mg resource.Managed, d time.Duration) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	key := types.NamespacedName{Namespace: mg.GetNamespace(), Name: mg.GetName()}
	if was, ok := h.soon[key]; !ok || d < was {
		h.soon[key] = d
	}
}

// take returns and forgets what was noted for key.
func (h *retryHints) take(key types.NamespacedName) (time.Duration, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.after[key]
	delete(h.after, key)
	return d, ok
}

// takeSoon returns and forgets what noteSoon noted for key.
func (h *retryHints) takeSoon(key types.NamespacedName) (time.Duration, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.soon[key]
	delete(h.soon, key)
	return d, ok
}

// retryAfter wraps the managed reconciler: a reconcile whose external
// client noted a wait is requeued after it (controller-runtime then also
// resets the resource's backoff) instead of through the backoff.
type retryAfter struct {
	inner reconcile.Reconciler
	hints *retryHints
}

func (r retryAfter) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// A hint is only for the reconcile that noted it.
	r.hints.take(req.NamespacedName)
	r.hints.takeSoon(req.NamespacedName)
	res, err := r.inner.Reconcile(ctx, req)
	soon, hasSoon := r.hints.takeSoon(req.NamespacedName)
	d, ok := r.hints.take(req.NamespacedName)
	// Only ever sooner than the runtime's own requeue: a result without
	// one (the resource gone) stays without.
	if !ok && hasSoon && err == nil && !res.Requeue && res.RequeueAfter > soon { //nolint:staticcheck // The runtime returns Requeue.
		return reconcile.Result{RequeueAfter: soon}, nil
	}
	if !ok || err != nil {
		return res, err
	}
	if res.RequeueAfter > 0 && res.RequeueAfter < d {
		res.RequeueAfter = d
	}
	if res.RequeueAfter == 0 {
		res = reconcile.Result{RequeueAfter: d}
	}
	return res, nil
}
