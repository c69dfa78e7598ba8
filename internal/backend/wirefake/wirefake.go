// Package wirefake holds what the backends' wire-format fakes (pvetest,
// gcptest) share: their test controls read and change the fake's state
// under its one lock.
package wirefake

import "sync"

// Do runs fn holding mu (a test control's change).
func Do(mu *sync.Mutex, fn func()) {
	mu.Lock()
	defer mu.Unlock()
	fn()
}

// Read returns what fn reads holding mu.
func Read[T any](mu *sync.Mutex, fn func() T) T {
	mu.Lock()
	defer mu.Unlock()
	return fn()
}
