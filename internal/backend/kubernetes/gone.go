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
// without reading the API server again (a live read per proxy deleted).
// A miss can only be trusted when the
// last thing the watch said of the name was its deletion and this driver
// has not created it since: a Deployment created a moment ago may not be
// in the cache yet, and a resource deleted then must not let it leak.
//
// It also remembers the Deployments a driver is creating that the watch
// has not delivered yet: a miss of one of those is not trusted either (a
// reconcile right after Create, before the cache has it, would Create
// again, fail with AlreadyExists, adopt it and rewrite its children).
// Once the create is answered, the answer stands in for the cache until
// the watch delivers the Deployment, so that a reconcile right after
// Create reads nothing; before it, one live read confirms the miss.
type gone struct {
	mu   sync.Mutex
	m    map[types.NamespacedName]time.Time
	made map[types.NamespacedName]madeDeployment
}

// madeDeployment is a Deployment a driver is creating: since when, and
// once the create was answered, the Deployment as the answer gave it
// (stripped as the cache strips it).
type madeDeployment struct {
	at  time.Time
	dep *appsv1.Deployment
}

// unseenTTL is how long a Deployment being created is remembered as not
// yet delivered by the watch: a watch delivers within seconds.
const unseenTTL = time.Minute

func newGone() *gone {
	return &gone{m: map[types.NamespacedName]time.Time{}, made: map[types.NamespacedName]madeDeployment{}}
}

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
				g.forget(k, false)
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
			delete(g.made, k)
		},
	}
}

// seen reports whether the watch saw k deleted (and nothing of k since);
// false for a nil g.
func (g *gone) seen(k types.NamespacedName) bool { return g.recent(k, false) }

// since is how long ago the watch saw k deleted (and nothing of k
// since); false when it did not, or for a nil g.
func (g *gone) since(k types.NamespacedName) (time.Duration, bool) {
	if g == nil {
		return 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.m[k]
	if !ok {
		return 0, false
	}
	ago := time.Since(at)
	return ago, ago <= goneTTL
}

// unseen reports whether a driver created k less than unseenTTL ago and
// the watch has not delivered it yet; false for a nil g.
func (g *gone) unseen(k types.NamespacedName) bool { return g.recent(k, true) }

// recent is seen, or unseen when made.
func (g *gone) recent(k types.NamespacedName, made bool) bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if made {
		e, ok := g.made[k]
		return ok && time.Since(e.at) <= unseenTTL
	}
	at, ok := g.m[k]
	return ok && time.Since(at) <= goneTTL
}

// answered keeps dep, as the API server answered this driver's create of
// k, until the watch delivers it; nothing when k is no longer unseen.
func (g *gone) answered(k types.NamespacedName, dep *appsv1.Deployment) {
	if g == nil {
		return
	}
	c := dep.DeepCopy()
	if _, err := StripDeployment(c); err != nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.made[k]; ok && time.Since(e.at) <= unseenTTL {
		e.dep = c
		g.made[k] = e
	}
}

// asAnswered is a copy of the Deployment k as its create was answered,
// while the watch has not delivered it; nil otherwise.
func (g *gone) asAnswered(k types.NamespacedName) *appsv1.Deployment {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.made[k]
	if !ok || e.dep == nil || time.Since(e.at) > unseenTTL {
		return nil
	}
	return e.dep.DeepCopy()
}

// forget drops what is known of k: the watch delivered a Deployment of
// the name. With creating, a driver is about to create k instead: a miss
// is then not trusted until the watch delivers it (unseen).
func (g *gone) forget(k types.NamespacedName, creating bool) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.m, k)
	delete(g.made, k)
	if creating {
		now := time.Now()
		maps.DeleteFunc(g.made, func(_ types.NamespacedName, e madeDeployment) bool { return now.Sub(e.at) > unseenTTL })
		g.made[k] = madeDeployment{at: now}
	}
}
