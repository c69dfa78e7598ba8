package kubernetes

import (
	"maps"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
)

// goneTTL is how long a Deployment the watch saw deleted is remembered.
// Long enough for a resource being deleted to be reconciled again after
// its Deployment went; after it, a miss is confirmed live again.
const goneTTL = 5 * time.Minute

// gone remembers the Deployments the cache's watch saw deleted, so that
// a resource being deleted can trust the cache's miss of its Deployment
// without reading the API server again (one request per proxy in the
// delete phase, make bench-podproxy). A miss can only be trusted when the
// last thing the watch said of the name was its deletion and this driver
// has not created it since: a Deployment created a moment ago may not be
// in the cache yet, and a resource deleted then must not let it leak.
type gone struct {
	mu sync.Mutex
	m  map[types.NamespacedName]time.Time
}

func newGone() *gone { return &gone{m: map[types.NamespacedName]time.Time{}} }

// handler keeps g from a Deployment informer's events.
func (g *gone) handler() toolscache.ResourceEventHandler {
	key := func(obj any) (types.NamespacedName, bool) {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		dep, ok := obj.(*appsv1.Deployment)
		if !ok {
			return types.NamespacedName{}, false
		}
		return types.NamespacedName{Namespace: dep.Namespace, Name: dep.Name}, true
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if k, ok := key(obj); ok {
				g.forget(k)
			}
		},
		DeleteFunc: func(obj any) {
			k, ok := key(obj)
			if !ok {
				return
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			now := time.Now()
			maps.DeleteFunc(g.m, func(_ types.NamespacedName, at time.Time) bool { return now.Sub(at) > goneTTL })
			g.m[k] = now
		},
	}
}

// seen reports whether the watch saw k deleted (and nothing of k since);
// false for a nil g.
func (g *gone) seen(k types.NamespacedName) bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.m[k]
	return ok && time.Since(at) <= goneTTL
}

// forget drops k: a Deployment of the name is (about to be) created.
func (g *gone) forget(k types.NamespacedName) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.m, k)
}
