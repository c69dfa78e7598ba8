package provider

import (
	"context"
	"net/http/httptest"
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
