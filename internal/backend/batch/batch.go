// Package batch lets the Observes of many steady proxies of one config
// share one backend list call (Proxmox /cluster/resources, the Compute
// Engine aggregated list), so that polling N Ready proxies costs about
// poll/MaxAge list calls a poll instead of N reads.
//
// The freshness rule: an Observe is answered from a snapshot only when the
// snapshot's list call started after the same instance's previous Observe
// began, and at most MaxAge ago. So every poll of an instance sees data
// newer than anything its previous poll saw (an Observe never answers
// from data older than the poll it serves), and a change on the backend
// reaches the resource within poll + MaxAge. A list in flight that
// qualifies is joined instead of sending a second one. What is not steady
// (an instance being created, updated or deleted, or not Ready) is the
// driver's to read directly; Observed then records that read, so a later
// snapshot must be newer still.
package batch

import (
	"context"
	"maps"
	"sync"
	"time"
)

// DefaultMaxAge is the age limit a driver uses when it is given none: an
// eighth of the provider's default poll (5 minutes), so a config's steady
// proxies cost at most eight list calls a poll, whatever their number.
const DefaultMaxAge = 5 * time.Minute / 8

// Snapshots holds the latest snapshot of every config key and, per
// instance key, when its previous Observe began. The zero value is not
// ready: use New. It is safe for concurrent use.
type Snapshots[T any] struct {
	maxAge time.Duration
	now    func() time.Time

	mu    sync.Mutex
	snaps map[string]*snapshot[T]
	last  map[string]time.Time
	// swept is when last was last rid of entries older than maxAge.
	swept time.Time
}

type snapshot[T any] struct {
	taken time.Time // when its list call started
	done  chan struct{}
	val   T
	err   error
}

// New returns Snapshots whose answers are at most maxAge old (zero or
// less: DefaultMaxAge); now is the clock (nil: time.Now).
func New[T any](maxAge time.Duration, now func() time.Time) *Snapshots[T] {
	if maxAge <= 0 {
		maxAge = DefaultMaxAge
	}
	if now == nil {
		now = time.Now
	}
	return &Snapshots[T]{maxAge: maxAge, now: now, snaps: map[string]*snapshot[T]{}, last: map[string]time.Time{}}
}

// MaxAge is the age limit of an answer.
func (s *Snapshots[T]) MaxAge() time.Duration { return s.maxAge }

// Get returns a snapshot of config key for the Observe of instance inst:
// the latest one when it qualifies (see the package comment), else the
// one in flight when that qualifies, else a new one from list, whose
// error is returned as it is (and not kept). It records the Observe's
// start. fresh is true when this call sent the list.
func (s *Snapshots[T]) Get(ctx context.Context, key, inst string, list func(context.Context) (T, error)) (val T, taken time.Time, fresh bool, err error) {
	s.mu.Lock()
	now := s.now()
	s.sweep(now)
	prev, seen := s.last[inst]
	s.last[inst] = now
	sn := s.snaps[key]
	usable := sn != nil && now.Sub(sn.taken) <= s.maxAge && (!seen || sn.taken.After(prev))
	if !usable {
		sn = &snapshot[T]{taken: now, done: make(chan struct{})}
		s.snaps[key] = sn
		s.mu.Unlock()
		sn.val, sn.err = list(ctx)
		if sn.err != nil {
			s.mu.Lock()
			if s.snaps[key] == sn {
				delete(s.snaps, key) // the next Observe tries again
			}
			s.mu.Unlock()
		}
		close(sn.done)
		return sn.val, sn.taken, true, sn.err
	}
	s.mu.Unlock()
	select {
	case <-sn.done:
	case <-ctx.Done():
		var zero T
		return zero, time.Time{}, false, ctx.Err()
	}
	return sn.val, sn.taken, false, sn.err
}

// Observed records that inst was just read directly: a snapshot must have
// been taken after now to answer its next Observe.
func (s *Snapshots[T]) Observed(inst string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last[inst] = s.now()
}

// sweep drops, at most once per maxAge, the Observe starts older than
// maxAge: a snapshot young enough to answer was taken after them anyway,
// so they decide nothing, and an instance deleted (never observed again)
// would otherwise stay for ever. Called with mu held.
func (s *Snapshots[T]) sweep(now time.Time) {
	if now.Sub(s.swept) < s.maxAge {
		return
	}
	s.swept = now
	maps.DeleteFunc(s.last, func(_ string, at time.Time) bool { return now.Sub(at) > s.maxAge })
}

// Forget drops what is kept of inst (it was deleted).
func (s *Snapshots[T]) Forget(inst string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.last, inst)
}
