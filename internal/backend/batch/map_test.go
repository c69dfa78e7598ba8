package batch

import (
	"sync"
	"testing"
)

// TestMap: the zero Map is empty and usable, from many goroutines at once.
func TestMap(t *testing.T) {
	var m Map[string, int]
	if _, ok := m.Get("a"); ok {
		t.Fatal("the zero Map has a value")
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { m.Set(string(rune('a'+i)), i) })
	}
	wg.Wait()
	m.Delete("b")
	if v, ok := m.Get("c"); !ok || v != 2 {
		t.Errorf("Get(c) = %d, %v; want 2, true", v, ok)
	}
	if _, ok := m.Get("b"); ok {
		t.Error("Get(b) after Delete found a value")
	}
}
