package external

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// runtimeRequeue is what crossplane-runtime v2.4.0 returns after a failed
// external call.
var runtimeRequeue = reconcile.Result{Requeue: true} //nolint:staticcheck // What the runtime returns, deprecated or not.

// runtimeFailing stands for crossplane-runtime's managed reconciler when
// the external client fails: the client's error is noted (as external's
// span does), and the runtime asks for a rate-limited requeue.
type runtimeFailing struct {
	hints *retryHints
	mg    *nsproxy.KVMProxy
	err   error
}

func (r runtimeFailing) Reconcile(context.Context, reconcile.Request) (reconcile.Result, error) {
	r.hints.note(r.mg, r.err)
	return runtimeRequeue, nil
}

// TestQuotaRequeuesOnItsOwnInterval: a reconcile that failed for quota is
// requeued after the quota interval (or the backend's longer
// Retry-After), not through the controller's backoff, which would retry
// within a minute; other failures keep the backoff unless the backend
// said how long to wait; a hint never outlives its reconcile.
func TestQuotaRequeuesOnItsOwnInterval(t *testing.T) {
	mg := &nsproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web"}}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team-a", Name: "web"}}
	quota := proxy.Quotaf("storage pool default on host lab has 5120 MiB available")
	cases := []struct {
		name string
		err  error
		want reconcile.Result
	}{
		{"Quota", quota, reconcile.Result{RequeueAfter: 7 * time.Minute}},
		{"QuotaWithALongerRetryAfter", &proxy.Error{Class: proxy.ClassQuota, RetryAfter: 20 * time.Minute, Err: quota}, reconcile.Result{RequeueAfter: 20 * time.Minute}},
		{"QuotaWithAShorterRetryAfter", &proxy.Error{Class: proxy.ClassQuota, RetryAfter: time.Second, Err: quota}, reconcile.Result{RequeueAfter: 7 * time.Minute}},
		{"TransientWithRetryAfter", proxy.WithContext(&proxy.Error{Class: proxy.ClassTransient, RetryAfter: 90 * time.Second, Err: quota}, "p", "create"), reconcile.Result{RequeueAfter: 90 * time.Second}},
		{"Transient", proxy.Transientf("busy"), runtimeRequeue},
		{"Permanent", proxy.Permanentf("no such image"), runtimeRequeue},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newRetryHints(7 * time.Minute)
			r := retryAfter{inner: runtimeFailing{hints: h, mg: mg, err: tc.err}, hints: h}
			got, err := r.Reconcile(context.Background(), req)
			if err != nil || got != tc.want {
				t.Errorf("Reconcile = %+v, %v; want %+v", got, err, tc.want)
			}
			if _, left := h.take(req.NamespacedName); left {
				t.Error("the hint outlived its reconcile")
			}
		})
	}
	t.Run("StaleHintIsDropped", func(t *testing.T) {
		h := newRetryHints(7 * time.Minute)
		h.note(mg, quota) // from a reconcile that did not finish through retryAfter
		r := retryAfter{inner: runtimeFailing{hints: h, mg: mg, err: proxy.Transientf("busy")}, hints: h}
		if got, _ := r.Reconcile(context.Background(), req); got != runtimeRequeue {
			t.Errorf("Reconcile = %+v; want the runtime's own requeue", got)
		}
	})
	t.Run("TheConditionSaysWhen", func(t *testing.T) {
		h := newRetryHints(7 * time.Minute)
		msg := describe(quota, "cannot create the instance", h.wait(quota)).Error()
		if !strings.Contains(msg, "out of quota or capacity on the backend; will retry in 7m0s") {
			t.Errorf("condition message %q does not say when it retries", msg)
		}
	})
}

// runtimeSucceeding stands for crossplane-runtime's managed reconciler
// after an Observe that noted an instance whose proxy does not answer
// yet: it returns the not-Ready poll.
type runtimeSucceeding struct {
	hints *retryHints
	mg    *nsproxy.KVMProxy
	soon  bool
	res   reconcile.Result
}

func (r runtimeSucceeding) Reconcile(context.Context, reconcile.Request) (reconcile.Result, error) {
	if r.soon {
		r.hints.noteSoon(r.mg, time.Second)
	}
	return r.res, nil
}

// TestAnInstanceWaitingForItsProxyIsLookedAtSoon: a new instance with an
// address whose Squid does not answer yet is observed again a second
// later, not at the not-Ready poll; nothing else changes.
func TestAnInstanceWaitingForItsProxyIsLookedAtSoon(t *testing.T) {
	mg := &nsproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web"}}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team-a", Name: "web"}}
	poll := reconcile.Result{RequeueAfter: 10 * time.Second}
	cases := []struct {
		name string
		soon bool
		res  reconcile.Result
		want reconcile.Result
	}{
		{"Waiting", true, poll, reconcile.Result{RequeueAfter: time.Second}},
		{"NotWaiting", false, poll, poll},
		{"RuntimeRequeuesAtOnce", true, runtimeRequeue, runtimeRequeue},
		{"SoonerAlready", true, reconcile.Result{RequeueAfter: 100 * time.Millisecond}, reconcile.Result{RequeueAfter: 100 * time.Millisecond}},
		{"NoRequeueStaysWithout", true, reconcile.Result{}, reconcile.Result{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newRetryHints(time.Minute)
			r := retryAfter{inner: runtimeSucceeding{hints: h, mg: mg, soon: tc.soon, res: tc.res}, hints: h}
			if got, err := r.Reconcile(context.Background(), req); err != nil || got != tc.want {
				t.Errorf("Reconcile = %+v, %v; want %+v", got, err, tc.want)
			}
			if _, left := h.takeSoon(req.NamespacedName); left {
				t.Error("the hint outlived its reconcile")
			}
		})
	}
	now := time.Now()
	for _, c := range []struct {
		name string
		inst proxy.Instance
		want bool
	}{
		{"NewNotAnswering", proxy.Instance{State: proxy.StateRunning, IP: "10.0.0.5", CreatedAt: now.Add(-time.Minute)}, true},
		{"Answering", proxy.Instance{State: proxy.StateRunning, IP: "10.0.0.5", ProxyReachable: true, CreatedAt: now.Add(-time.Minute)}, false},
		{"NoAddressYet", proxy.Instance{State: proxy.StateProvisioning, CreatedAt: now.Add(-time.Minute)}, false},
		{"OldNotAnswering", proxy.Instance{State: proxy.StateRunning, IP: "10.0.0.5", CreatedAt: now.Add(-time.Hour)}, false},
		{"UnknownAge", proxy.Instance{State: proxy.StateRunning, IP: "10.0.0.5"}, false},
	} {
		if got := answerSoon(c.inst, now); got != c.want {
			t.Errorf("answerSoon(%s) = %v, want %v", c.name, got, c.want)
		}
	}
}
