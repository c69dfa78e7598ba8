package batch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// lister counts list calls; each answers its own number.
type lister struct {
	mu    sync.Mutex
	calls int
}

func (l *lister) list(context.Context) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	return l.calls, nil
}

func setup() (*Snapshots[int], *clock, *lister) {
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	return New[int](10*time.Second, c.now), c, &lister{}
}

func TestSnapshotSharedWithinMaxAge(t *testing.T) {
	s, c, l := setup()
	ctx := context.Background()
	for i, inst := range []string{"a", "b", "c"} {
		v, _, fresh, err := s.Get(ctx, "cfg", inst, l.list)
		if err != nil || v != 1 {
			t.Fatalf("Get %s: %v, %v; want the first list's answer", inst, v, err)
		}
		if fresh != (i == 0) {
			t.Errorf("Get %s: fresh = %v", inst, fresh)
		}
		c.advance(time.Second)
	}
	if l.calls != 1 {
		t.Errorf("three steady instances of one config within the max age made %d list calls, want 1", l.calls)
	}
}

func TestSnapshotNeverOlderThanTheInstancesPreviousObserve(t *testing.T) {
	s, c, l := setup()
	ctx := context.Background()
	if _, _, _, err := s.Get(ctx, "cfg", "a", l.list); err != nil {
		t.Fatal(err)
	}
	c.advance(time.Second)
	// Within the max age, but taken before a's previous Observe began: a
	// second poll of a must not see the data its first poll saw.
	v, _, fresh, err := s.Get(ctx, "cfg", "a", l.list)
	if err != nil {
		t.Fatal(err)
	}
	if !fresh || v != 2 {
		t.Errorf("a's second Observe answered from list %d (fresh %v), want a new list (2)", v, fresh)
	}
	// b has not been observed since: list 2 serves it.
	if v, _, _, _ := s.Get(ctx, "cfg", "b", l.list); v != 2 {
		t.Errorf("b got list %d, want 2", v)
	}
}

func TestSnapshotNotPastMaxAge(t *testing.T) {
	s, c, l := setup()
	ctx := context.Background()
	_, _, _, _ = s.Get(ctx, "cfg", "a", l.list)
	c.advance(10*time.Second + time.Nanosecond)
	if v, _, fresh, _ := s.Get(ctx, "cfg", "b", l.list); !fresh || v != 2 {
		t.Errorf("a snapshot past the max age answered (list %d, fresh %v)", v, fresh)
	}
}

func TestSnapshotKeysAreSeparate(t *testing.T) {
	s, _, l := setup()
	ctx := context.Background()
	_, _, _, _ = s.Get(ctx, "cfg-1", "a", l.list)
	if v, _, fresh, _ := s.Get(ctx, "cfg-2", "b", l.list); !fresh || v != 2 {
		t.Errorf("another config's snapshot answered (list %d)", v)
	}
}

func TestSnapshotAfterADirectRead(t *testing.T) {
	s, c, l := setup()
	ctx := context.Background()
	_, _, _, _ = s.Get(ctx, "cfg", "b", l.list) // list 1
	c.advance(time.Second)
	s.Observed("a") // a read its own instance after list 1 was taken
	c.advance(time.Second)
	if v, _, fresh, _ := s.Get(ctx, "cfg", "a", l.list); !fresh || v != 2 {
		t.Errorf("a snapshot older than the instance's direct read answered (list %d)", v)
	}
}

func TestSnapshotInFlightIsJoined(t *testing.T) {
	s, _, _ := setup()
	ctx := context.Background()
	release := make(chan struct{})
	var calls int
	var mu sync.Mutex
	slow := func(context.Context) (int, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		<-release
		return 7, nil
	}
	first := make(chan int)
	go func() {
		v, _, _, _ := s.Get(ctx, "cfg", "a", slow)
		first <- v
	}()
	for {
		mu.Lock()
		n := calls
		mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	second := make(chan int)
	go func() {
		v, _, _, _ := s.Get(ctx, "cfg", "b", slow)
		second <- v
	}()
	close(release)
	if a, b := <-first, <-second; a != 7 || b != 7 {
		t.Errorf("answers %d and %d, want 7 twice", a, b)
	}
	if calls != 1 {
		t.Errorf("%d list calls, want 1: the second Observe joins the one in flight", calls)
	}
}

func TestSnapshotErrorIsNotKept(t *testing.T) {
	s, _, l := setup()
	ctx := context.Background()
	boom := errors.New("503 Service Unavailable")
	if _, _, _, err := s.Get(ctx, "cfg", "a", func(context.Context) (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the list's", err)
	}
	if v, _, fresh, err := s.Get(ctx, "cfg", "b", l.list); err != nil || !fresh || v != 1 {
		t.Errorf("after a failed list: %d, %v, fresh %v; want a new list", v, err, fresh)
	}
}

func TestDeletedInstancesAreNotKeptForever(t *testing.T) {
	s, c, l := setup()
	ctx := context.Background()
	for _, inst := range []string{"gone-1", "gone-2", "gone-3"} {
		if _, _, _, err := s.Get(ctx, "cfg", inst, l.list); err != nil {
			t.Fatal(err)
		}
	}
	// The three are deleted; another instance goes on being observed.
	for range 3 {
		c.advance(6 * time.Second)
		if _, _, _, err := s.Get(ctx, "cfg", "steady", l.list); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.last) != 1 {
		t.Errorf("kept the Observe starts of %d instances after three were deleted more than the max age ago, want only the steady one's", len(s.last))
	}
}

func TestSnapshotAfterAnOldObserveStillAnswers(t *testing.T) {
	s, c, l := setup()
	ctx := context.Background()
	if _, _, _, err := s.Get(ctx, "cfg", "a", l.list); err != nil {
		t.Fatal(err)
	}
	// a's start is swept; a snapshot taken since still answers a (it was
	// taken after a's previous Observe) and one older than that does not.
	c.advance(11 * time.Second)
	if _, _, _, err := s.Get(ctx, "cfg", "b", l.list); err != nil {
		t.Fatal(err)
	}
	c.advance(time.Second)
	v, _, fresh, err := s.Get(ctx, "cfg", "a", l.list)
	if err != nil || fresh || v != 2 {
		t.Errorf("a after its start was swept: %v (fresh %v, %v); want the snapshot b's Observe took", v, fresh, err)
	}
}
