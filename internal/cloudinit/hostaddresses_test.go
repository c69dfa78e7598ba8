package cloudinit_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
)

// TestHypervisorLookupNamesNoDNSServer: a hypervisor's name that cannot be
// resolved is refused in words that do not name the provider's DNS server
// (in a pod, the cluster DNS Service's address), which a tenant's config
// would otherwise read in its condition.
func TestHypervisorLookupNamesNoDNSServer(t *testing.T) {
	const server = "127.0.0.1:9" // stands for the cluster DNS Service: nothing listens
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", server)
	}}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := cloudinit.HostAddresses(ctx, r, "kvm.hosts[0].address", "hv.example.com")
	if err == nil {
		t.Fatal("a name that cannot be resolved was accepted")
	}
	if msg := err.Error(); strings.Contains(msg, server) || !strings.Contains(msg, "kvm.hosts[0].address") || !strings.Contains(msg, "hv.example.com") {
		t.Errorf("error %q: want the field and the name, not the DNS server", msg)
	}
}
