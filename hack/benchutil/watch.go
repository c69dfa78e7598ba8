package benchutil

import (
	"context"
	"errors"
	"maps"
	"sync"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Watch adds a handler to ca's informer of obj's kind that calls seen on
// every add and update (with the new object) and gone on every delete,
// each with the time the event came; either may be nil.
func Watch(ctx context.Context, ca cache.Cache, obj client.Object, seen, gone func(o client.Object, at time.Time)) error {
	inf, err := ca.GetInformer(ctx, obj)
	if err != nil {
		return err
	}
	call := func(fn func(client.Object, time.Time)) func(any) {
		return func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if o, ok := obj.(client.Object); ok && fn != nil {
				fn(o, time.Now())
			}
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    call(seen),
		UpdateFunc: func(_, n any) { call(seen)(n) },
		DeleteFunc: call(gone),
	})
	return err
}

// IsReady says whether o, a managed resource, has Ready=True.
func IsReady(o client.Object) bool {
	c, ok := o.(interface {
		GetCondition(xpv2.ConditionType) xpv2.Condition
	})
	return ok && c.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue
}

// Readiness records, for the managed resources of one kind, when each was
// first seen Ready and when each was deleted, by UID.
type Readiness struct {
	mu      sync.Mutex
	ready   map[string]time.Time
	gone    map[string]time.Time
	names   map[string]string
	changed chan struct{}
}

// WatchReady creates a cache of cfg with opts, records in it the
// readiness of the managed resources of obj's kind, lets more add handlers
// of its own (nil for none), and starts it.
func WatchReady(ctx context.Context, cfg *rest.Config, opts cache.Options, obj client.Object, more func(cache.Cache) error) (*Readiness, error) {
	ca, err := cache.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	r := &Readiness{ready: map[string]time.Time{}, gone: map[string]time.Time{}, names: map[string]string{}, changed: make(chan struct{}, 1)}
	seen := func(o client.Object, at time.Time) {
		if !IsReady(o) {
			return
		}
		uid := string(o.GetUID())
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, ok := r.ready[uid]; ok {
			return
		}
		r.ready[uid], r.names[uid] = at, o.GetName()
		select {
		case r.changed <- struct{}{}:
		default:
		}
	}
	gone := func(o client.Object, at time.Time) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.gone[string(o.GetUID())] = at
	}
	if err := Watch(ctx, ca, obj, seen, gone); err != nil {
		return nil, err
	}
	if more != nil {
		if err := more(ca); err != nil {
			return nil, err
		}
	}
	return r, StartCache(ctx, ca)
}

// Len is how many have been seen Ready.
func (r *Readiness) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ready)
}

// Snapshot copies what was recorded: when each was first Ready and when
// each was deleted, and its name, by UID.
func (r *Readiness) Snapshot() (ready, gone map[string]time.Time, names map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.ready), maps.Clone(r.gone), maps.Clone(r.names)
}

// Await waits until n have been seen Ready, calling progress every
// interval; false if timeout passed first.
func (r *Readiness) Await(ctx context.Context, n int, timeout, interval time.Duration, progress func(ready int)) (bool, error) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	deadline := time.After(timeout)
	for {
		if r.Len() >= n {
			return true, nil
		}
		select {
		case <-r.changed:
		case <-tick.C:
			progress(r.Len())
		case <-deadline:
			return r.Len() >= n, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// StartCache starts ca in the background and waits until its informers
// have synced.
func StartCache(ctx context.Context, ca cache.Cache) error {
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		return errors.New("the cache did not sync")
	}
	return nil
}
