//go:build !linux

package controlplane

import "testing"

// PlantLookalikes needs Linux: it fails the test elsewhere.
func PlantLookalikes(t testing.TB) func() []string {
	t.Fatal("look-alikes are planted on Linux only")
	return nil
}
