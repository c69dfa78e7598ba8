package kubernetes

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestProberCachesAndShares(t *testing.T) {
	var dials atomic.Int32
	p := &Prober{Dial: func(context.Context, string, string) (net.Conn, error) {
		dials.Add(1)
		c1, c2 := net.Pipe()
		_ = c2.Close()
		return c1, nil
	}}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, pending := p.Reachable(context.Background(), "mr/pod", "10.0.0.1:3128"); !ok || pending {
				t.Errorf("Reachable = %v, pending %v; want true", ok, pending)
			}
		}()
	}
	wg.Wait()
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials for 20 concurrent checks of one pod; want 1", n)
	}
	p.Reachable(context.Background(), "mr/pod", "10.0.0.2:3128") // a new address is a new check
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials after the address changed; want 2", n)
	}
}

func TestProberNegativeResultsExpireSoon(t *testing.T) {
	var dials atomic.Int32
	p := &Prober{NegativeTTL: 10 * time.Millisecond, Dial: func(context.Context, string, string) (net.Conn, error) {
		dials.Add(1)
		return nil, errors.New("connection refused")
	}}
	if ok, _ := p.Reachable(context.Background(), "k", "a:1"); ok {
		t.Fatal("Reachable = true for a refused dial")
	}
	p.Reachable(context.Background(), "k", "a:1")
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials within the negative TTL; want 1", n)
	}
	time.Sleep(20 * time.Millisecond)
	p.Reachable(context.Background(), "k", "a:1")
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials after the negative TTL; want 2", n)
	}
}

func TestProberSlowDialNotifies(t *testing.T) {
	release := make(chan struct{})
	notified := make(chan string, 1)
	p := &Prober{
		Wait:   10 * time.Millisecond,
		Notify: func(k string) { notified <- k },
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			<-release
			c1, c2 := net.Pipe()
			_ = c2.Close()
			return c1, nil
		},
	}
	start := time.Now()
	ok, pending := p.Reachable(context.Background(), "mr-uid/pod-uid", "10.0.0.1:3128")
	if ok || !pending {
		t.Fatalf("Reachable during a slow dial = %v, pending %v; want false, pending", ok, pending)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Reachable held the caller %v during a slow dial", took)
	}
	close(release)
	select {
	case k := <-notified:
		if k != "mr-uid/pod-uid" {
			t.Errorf("Notify(%q); want the check's key", k)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no Notify after the slow dial finished")
	}
	if ok, pending := p.Reachable(context.Background(), "mr-uid/pod-uid", "10.0.0.1:3128"); !ok || pending {
		t.Errorf("Reachable after the dial = %v, pending %v; want the kept result", ok, pending)
	}
}
