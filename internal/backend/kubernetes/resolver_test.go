package kubernetes

import (
	"context"
	"net"
	"net/netip"
)

// The tests name API servers such as https://api.example:6443: they send
// no DNS query for them (tests reach nothing beyond loopback). A test that
// needs a name resolved sets the driver's resolver itself.
func init() { defaultResolver = noLookups{} }

// noLookups finds no name.
type noLookups struct{}

func (noLookups) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return nil, &net.DNSError{Err: "no such host (the tests resolve no name)", Name: host, IsNotFound: true}
}
