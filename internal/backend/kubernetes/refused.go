package kubernetes

import (
	"maps"
	"sync"
	"time"
)

// refusedTTL is how long a refused deletecollection is remembered: a grant
// made meanwhile is used once it passes.
const refusedTTL = 5 * time.Minute

// maxRefused bounds refused: past it the set starts again empty, which
// costs one refused request per entry.
const maxRefused = 10000

// refusedKey is where a deletecollection was refused: RBAC grants it per
// namespace and resource.
type refusedKey struct{ namespace, resource string }

// refused remembers where the target cluster refused the driver a
// deletecollection (RBAC, or a server without the verb), so that the
// deletes there leave the children to the garbage collector without
// asking again. One set per Cluster (its zero value is empty); a nil set
// remembers nothing.
type refused struct {
	mu sync.Mutex
	m  map[refusedKey]time.Time
}

// recent reports whether k was refused less than refusedTTL before now.
func (r *refused) recent(k refusedKey, now time.Time) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.m[k]
	return ok && now.Sub(at) < refusedTTL
}

// add remembers that k was refused at now.
func (r *refused) add(k refusedKey, now time.Time) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	maps.DeleteFunc(r.m, func(_ refusedKey, at time.Time) bool { return now.Sub(at) >= refusedTTL })
	if r.m == nil || len(r.m) >= maxRefused {
		r.m = map[refusedKey]time.Time{}
	}
	r.m[k] = now
}
