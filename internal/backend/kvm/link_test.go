package kvm

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestLink_abandonedCallDoesNotCutOffOthers: one caller gives up on a hung
// call while another caller's slow call is running on the same
// connection; the other call completes, and only then is the connection
// closed (which is what unblocks the hung one).
func TestLink_abandonedCallDoesNotCutOffOthers(t *testing.T) {
	var closed atomic.Bool
	hung := make(chan struct{})
	l := newLink(func() error { closed.Store(true); close(hung); return nil }, time.Minute)
	var retired atomic.Bool
	l.setOnRetire(func(*link) { retired.Store(true) })

	slowDone := make(chan error, 1)
	slowRelease := make(chan struct{})
	go func() {
		slowDone <- l.call(context.Background(), time.Minute, func() error { <-slowRelease; return nil })
	}()
	ctx, cancel := context.WithCancel(context.Background())
	hungDone := make(chan error, 1)
	go func() {
		hungDone <- l.call(ctx, time.Minute, func() error { <-hung; return errors.New("connection closed") })
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-hungDone:
		if !proxy.IsTransient(err) || !errors.Is(err, context.Canceled) {
			t.Errorf("abandoned call = %v; want Transient wrapping the cancellation", err)
		}
	case <-time.After(time.Second):
		t.Fatal("the abandoned call did not return at once")
	}
	if !retired.Load() || l.usable() {
		t.Error("the link was not retired")
	}
	if closed.Load() {
		t.Fatal("the link was closed while another caller's call was running")
	}
	if err := l.call(context.Background(), time.Second, func() error { return nil }); err == nil {
		// A retired link still serves calls already handed out; a new
		// call is refused only once it is closed.
		t.Log("a call on a retired, open link ran (the pool stops handing it out)")
	}
	close(slowRelease)
	if err := <-slowDone; err != nil {
		t.Errorf("the other caller's call = %v; want success", err)
	}
	deadline := time.Now().Add(time.Second)
	for !closed.Load() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !closed.Load() {
		t.Error("the link was not closed once only the abandoned call remained")
	}
	if err := l.call(context.Background(), time.Second, func() error { return nil }); !proxy.IsTransient(err) {
		t.Errorf("a call on a closed link = %v; want Transient", err)
	}
}

// TestLink_budgetAbandonsAndLingerCloses: a call over its budget returns
// Transient; a retired link whose other calls never finish closes after
// Linger.
func TestLink_budgetAbandonsAndLingerCloses(t *testing.T) {
	closed := make(chan struct{})
	l := newLink(func() error { close(closed); return nil }, 100*time.Millisecond)
	stuck := make(chan struct{})
	defer close(stuck)
	go func() { _ = l.call(context.Background(), time.Hour, func() error { <-stuck; return nil }) }()
	time.Sleep(10 * time.Millisecond)
	// The call never finishes: only its budget can end it (the bound
	// keeps a broken budget from holding the suite; no speed target).
	errc := make(chan error, 1)
	go func() {
		errc <- l.call(context.Background(), 50*time.Millisecond, func() error { <-stuck; return nil })
	}()
	select {
	case err := <-errc:
		if !proxy.IsTransient(err) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call over budget = %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a call over its budget did not return")
	}
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		t.Fatal("the retired link did not close after Linger")
	}
}

func TestLink_cancelledContextNeverStartsTheCall(t *testing.T) {
	l := newLink(nil, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	if err := l.call(ctx, time.Second, func() error { ran = true; return nil }); !proxy.IsTransient(err) || ran {
		t.Errorf("call = %v, ran %t", err, ran)
	}
}

func TestKeyedLocks(t *testing.T) {
	var k keyedLocks
	unlock, err := k.lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := k.lock(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a waiter = %v; want its ctx's error", err)
	}
	if _, ok := k.tryLock("a"); ok {
		t.Error("tryLock took a held lock")
	}
	u2, err := k.lock(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	u2()
	unlock()
	unlock() // idempotent
	if n := k.size(); n != 0 {
		t.Errorf("%d entries left; the map must not grow with every key", n)
	}
	u3, ok := k.tryLock("a")
	if !ok {
		t.Fatal("tryLock of a free lock failed")
	}
	u3()
}
