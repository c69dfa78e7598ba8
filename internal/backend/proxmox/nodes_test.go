package proxmox_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid/squidtest"
)

// TestGuestsDenyEveryNodeOfTheCluster: a guest's Squid denies every
// online node's own addresses (its API, sshd, the bridge the guests use),
// not only the API's host, whatever ports the proxy allows; a node
// offline at the create is denied from the next update after it is back.
// A node whose network cannot be read stops the update before a seed is
// written, naming the node.
func TestGuestsDenyEveryNodeOfTheCluster(t *testing.T) {
	f := newFixture(t, withFake(func(o *pvetest.Options) {
		o.Nodes = []pvetest.Node{{Name: "pve1"}, {Name: "pve2", Addresses: []string{"198.51.100.11", "2001:db8:100::11"}}, {Name: "pve3", Offline: true}}
	}))
	ctx := context.Background()
	r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-nodes", "5b6c7d8e-1111-4a5e-9d55-0a9c1f1e2b3c")}
	r.req.Proxy.AllowedPorts = []int32{443, 22, 8006}
	r.converge(ctx, 20)
	denies := func(what string, want ...string) {
		t.Helper()
		conf := cloudinit.SquidConfOf(vmNamed(t, f.fake, r.req.Name).Seed.UserData)
		for _, w := range want {
			if !squidtest.NeverDenies(conf, netip.MustParseAddr(w)) {
				t.Errorf("%s: the seed's squid.conf does not deny the node at %s", what, w)
			}
		}
	}
	denies("create", "198.51.100.10", "198.51.100.11", "2001:db8:100::11")

	f.fake.SetNodeOnline("pve3", true)
	r.req.Proxy.AllowedPorts = []int32{443, 22}
	r.converge(ctx, 20)
	denies("update after pve3 is back", "198.51.100.10", "198.51.100.11", "198.51.100.12")

	f.fake.Inject(pvetest.Fault{Match: func(q pvetest.Request) bool {
		return q.Endpoint == "GET /nodes/{node}/network" && strings.HasPrefix(q.Path, "/nodes/pve2/")
	},
		Status: 500, Message: "unable to read network config"})
	before := vmNamed(t, f.fake, r.req.Name).Seed.MetaData
	r.req.Proxy.AllowedPorts = []int32{443}
	done, err := r.reconcile(ctx)
	var pe *proxy.Error
	if done || !errors.As(err, &pe) || !strings.Contains(err.Error(), "pve2") {
		t.Errorf("an update while pve2's network cannot be read: done %v, %v; want an error naming pve2", done, err)
	}
	if after := vmNamed(t, f.fake, r.req.Name).Seed.MetaData; after != before {
		t.Error("the update wrote a seed without pve2's addresses")
	}
}
