package kvm

import (
	"context"
	"sync"
)

// keyedLocks is a set of mutexes by key whose waiters give up when their
// ctx ends. An entry lives only while someone holds or waits for it, so the
// map does not grow with every name ever seen.
type keyedLocks struct {
	mu sync.Mutex
	m  map[string]*keyedLock
}

type keyedLock struct {
	sem  chan struct{}
	refs int
}

// lock takes key's lock, or returns ctx's error when ctx ends first. The
// returned function releases it.
func (k *keyedLocks) lock(ctx context.Context, key string) (func(), error) {
	return k.lockNow(ctx, key)
}

// lockNow is lock; with a ctx already ended it still takes a free lock,
// which tryLock relies on.
func (k *keyedLocks) lockNow(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyedLock{sem: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()

	drop := func() {
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	release := func() func() {
		var once sync.Once
		return func() {
			once.Do(func() {
				<-l.sem
				drop()
			})
		}
	}
	// A free lock is taken even with a ctx already ended (tryLock).
	select {
	case l.sem <- struct{}{}:
		return release(), nil
	default:
	}
	select {
	case l.sem <- struct{}{}:
		return release(), nil
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}

// size is the number of live entries (for tests).
func (k *keyedLocks) size() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}

// tryLock takes key's lock when it is free.
func (k *keyedLocks) tryLock(key string) (func(), bool) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	k.mu.Lock()
	l := k.m[key]
	k.mu.Unlock()
	if l != nil {
		return nil, false
	}
	unlock, err := k.lockNow(ctx, key)
	return unlock, err == nil
}
