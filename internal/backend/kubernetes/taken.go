package kubernetes

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// maxTaken bounds taken: past it the set starts again empty, which costs
// a refused resource one Deployment created and deleted at its next
// attempt, never a check.
const maxTaken = 10000

// taken are the proxy names (namespace and name) whose Create was refused
// because a child's name is someone else's. Create reads a child's name
// only when its create finds it taken, so a fresh proxy costs no reads;
// for these names it reads them all
// first, as a resource refused once retries through the controller's
// backoff and would otherwise create and delete a Deployment every time.
// One set per Cluster (its zero value is empty); a nil set remembers
// nothing.
type taken struct {
	mu sync.Mutex
	m  map[types.NamespacedName]struct{}
}

func (t *taken) has(k types.NamespacedName) bool {
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.m[k]
	return ok
}

func (t *taken) add(k types.NamespacedName) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil || len(t.m) >= maxTaken {
		t.m = map[types.NamespacedName]struct{}{}
	}
	t.m[k] = struct{}{}
}

func (t *taken) drop(k types.NamespacedName) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, k)
}
