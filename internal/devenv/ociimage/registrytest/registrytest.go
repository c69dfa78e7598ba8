// Package registrytest runs an OCI registry on a loopback port with TLS
// from a CA made for it (localcrossplane.Registry), for tests that push and
// pull images and packages the way users do.
package registrytest

import (
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
)

// Registry is a running registry; see localcrossplane.Registry.
type Registry = localcrossplane.Registry

// Start runs a registry on a free loopback port until the test ends.
func Start(t testing.TB) *Registry {
	t.Helper()
	r, err := localcrossplane.StartRegistry("127.0.0.1:0")
	if err != nil {
		t.Fatalf("registrytest: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}
