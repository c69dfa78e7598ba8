// Package wirefake holds what the backends' wire-format fakes (pvetest,
// gcptest) share: their test controls read and change the fake's state
// under its one lock, and they cut connections as a failing network does.
package wirefake

import (
	"net/http"
	"sync"
)

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

// HangUp closes the client's connection without an answer (a cut
// network, a front end that died mid-request).
func HangUp(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
