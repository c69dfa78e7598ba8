package proxmox

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid/squidtest"
)

// nameResolver resolves the names it holds; any other is not found.
type nameResolver map[string][]netip.Addr

func (r nameResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, Server: "10.96.0.10:53", IsNotFound: true}
}

// nodesAPI answers the reads of the cluster's nodes: a cluster of one
// node whose network states no address.
type nodesAPI struct{ API }

func (nodesAPI) Resources(context.Context, string) ([]Resource, error) {
	return []Resource{{ID: "node/pve1", Type: "node", Node: "pve1", Status: "online"}}, nil
}

func (nodesAPI) NodeNetwork(context.Context, string) ([]NodeInterface, error) {
	return []NodeInterface{{Iface: "vmbr0"}}, nil
}

// seedSquidConf is the squid.conf the seed ISO iso installs.
func seedSquidConf(t *testing.T, iso []byte) string {
	t.Helper()
	for name, content := range seedFiles(t, iso) {
		if strings.HasPrefix(name, "user") {
			return cloudinit.SquidConfOf(content)
		}
	}
	t.Fatal("the seed has no user-data")
	return ""
}

// TestSeedDeniesTheAPIHost: a guest's Squid denies the host of the
// config's API URL (often the node it runs on: its API on 8006, its
// sshd), whatever ports the proxy allows and also where the proxy opens
// its private range; a name at the addresses it resolves to. A name that
// does not resolve makes no seed: a Transient error naming proxmox.url
// and the name, never the resolver's server.
func TestSeedDeniesTheAPIHost(t *testing.T) {
	resolver := nameResolver{"pve.example": {netip.MustParseAddr("10.30.0.4"), netip.MustParseAddr("fd30::4")}}
	driver := func(t *testing.T, url string) *Driver {
		t.Helper()
		d, err := New(Options{Provider: "ClusterProviderConfig home-pve", Config: Config{URL: url}, API: nodesAPI{}, Resolver: resolver})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	req := proxy.Request{
		Name: "pt-hv", Mark: proxy.Mark{UID: "uid-1", InstallationID: "test-install"},
		Proxy: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{443, 22, 8006},
			AllowedDestinationCIDRs: []string{"10.30.0.0/24", "fd30::/64"}},
	}
	for url, want := range map[string][]string{
		"https://203.0.113.20:8006":   {"203.0.113.20"},
		"https://[2001:db8::20]:8006": {"2001:db8::20"},
		"https://pve.example:8006":    {"10.30.0.4", "fd30::4"},
		"https://pve.example":         {"10.30.0.4", "fd30::4"},
	} {
		t.Run(url, func(t *testing.T) {
			iso, err := driver(t, url).seed(context.Background(), req, 100123)
			if err != nil {
				t.Fatal(err)
			}
			conf := seedSquidConf(t, iso)
			for _, w := range want {
				if !squidtest.NeverDenies(conf, netip.MustParseAddr(w)) {
					t.Errorf("the seed's squid.conf does not deny the API's host at %s:\n%s", w, conf)
				}
			}
		})
	}

	_, err := driver(t, "https://gone.example:8006").seed(context.Background(), req, 100123)
	var pe *proxy.Error
	if !errors.As(err, &pe) || pe.Class != proxy.ClassTransient {
		t.Fatalf("a seed for an API host that does not resolve: %v; want a Transient error", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "proxmox.url") || !strings.Contains(msg, `"gone.example"`) || strings.Contains(msg, "10.96.0.10") {
		t.Errorf("%q does not name the field and the host, or names the resolver", msg)
	}
}
