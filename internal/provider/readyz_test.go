package provider

import (
	"context"
	"net/http/httptest"
	"slices"
	"testing"
)

type fakeSyncer bool

func (f fakeSyncer) WaitForCacheSync(context.Context) bool { return bool(f) }

func TestReadyzWaitsForTheCaches(t *testing.T) {
	cases := map[string]struct {
		synced bool
		ready  bool
	}{
		"CachesSynced":    {synced: true, ready: true},
		"CachesNotSynced": {synced: false, ready: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := cachesSynced(fakeSyncer(tc.synced))(httptest.NewRequest("GET", "/readyz", nil))
			if got := err == nil; got != tc.ready {
				t.Errorf("ready: got %v (%v), want %v", got, err, tc.ready)
			}
		})
	}
}

// syncerSequence answers WaitForCacheSync from answers in turn, then
// false.
type syncerSequence struct{ answers []bool }

func (s *syncerSequence) WaitForCacheSync(context.Context) bool {
	if len(s.answers) == 0 {
		return false
	}
	a := s.answers[0]
	s.answers = s.answers[1:]
	return a
}

// An informer started after the first sync (a kind first read later) is
// not synced for a while; a replica that was ready stays ready.
func TestReadyzStaysReadyOnceSynced(t *testing.T) {
	check := cachesSynced(&syncerSequence{answers: []bool{false, true, false, false}})
	var got []bool
	for range 5 {
		got = append(got, check(httptest.NewRequest("GET", "/readyz", nil)) == nil)
	}
	if want := []bool{false, true, true, true, true}; !slices.Equal(got, want) {
		t.Errorf("ready after each probe: got %v, want %v", got, want)
	}
}
