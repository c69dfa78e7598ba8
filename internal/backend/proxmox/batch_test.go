package proxmox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// steadyFleet brings n proxies to Ready on one fake cluster.
func steadyFleet(t *testing.T, n int) (*fixture, []*reconciler) {
	t.Helper()
	f := newFixture(t)
	ctx := context.Background()
	var rs []*reconciler
	for i := range n {
		r := &reconciler{t: t, f: f, drv: f.drv, req: f.request(fmt.Sprintf("fleet-%02d", i), fmt.Sprintf("7d0c1a52-4a5e-4f7e-8d55-%012d", i))}
		r.converge(ctx, 20)
		rs = append(rs, r)
	}
	return f, rs
}

// poll observes every proxy once, as a poll of each would, and returns
// what each Get reported.
func poll(t *testing.T, rs []*reconciler) []proxy.Instance {
	t.Helper()
	var out []proxy.Instance
	for _, r := range rs {
		inst, err := r.drv.Get(context.Background(), r.ref())
		if err != nil {
			t.Fatalf("Get %s: %v", r.req.Name, err)
		}
		out = append(out, inst)
	}
	return out
}

func TestSteadyProxiesShareOneListAPoll(t *testing.T) {
	f, rs := steadyFleet(t, 20)
	for round := range 3 {
		f.fake.ResetRequests()
		for i, inst := range poll(t, rs) {
			if inst.State != proxy.StateRunning || !inst.ProxyReachable || inst.IP == "" || inst.SpecHash != proxy.Hash(rs[i].req) {
				t.Fatalf("round %d: %s = %+v; want Running, reachable, with its address and spec", round, rs[i].req.Name, inst)
			}
		}
		got := endpoints(f.fake.Requests())
		if got["GET /cluster/resources"] != 1 || len(got) != 1 {
			t.Errorf("round %d: a poll of 20 steady proxies sent %v; want one GET /cluster/resources and nothing else", round, got)
		}
	}
}

// A VM that stops answering is read directly in the same Get.
func TestSteadyProxyThatStopsAnsweringIsReadDirectly(t *testing.T) {
	f, rs := steadyFleet(t, 3)
	poll(t, rs)
	// Stopped behind the provider's back, after the snapshot its last
	// poll used: the next poll must not answer from that snapshot.
	if err := f.fake.SetQMPStatus(vmidOf(t, rs[1].status.ID), "paused"); err != nil {
		t.Fatal(err)
	}
	f.fake.ResetRequests()
	got := poll(t, rs)
	if got[1].State != proxy.StateStopped {
		t.Errorf("a paused VM reads %s at the next poll; want Stopped", got[1].State)
	}
	if got[0].State != proxy.StateRunning || got[2].State != proxy.StateRunning {
		t.Errorf("the others read %s and %s; want Running", got[0].State, got[2].State)
	}
	if n := endpoints(f.fake.Requests())["GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces"]; n != 1 {
		t.Errorf("%d guest-agent calls; want 1: the VM that stopped answering is read directly", n)
	}
}

// An Observe never answers from a snapshot taken before that VM's previous
// Observe began: a change made before a poll is seen at the latest by the
// poll after it (the one right after the change may be served by a
// snapshot taken between the two, at most ObserveMaxAge old).
func TestSteadyProxySeesAChangeByTheSecondPollAfterIt(t *testing.T) {
	f, rs := steadyFleet(t, 3)
	poll(t, rs)
	if err := f.fake.Lock(vmidOf(t, rs[1].status.ID), "backup"); err != nil {
		t.Fatal(err)
	}
	poll(t, rs) // began after the change
	got := poll(t, rs)
	if !strings.Contains(got[1].Progress, "locked (backup)") {
		t.Errorf("a locked VM reads %+v two polls after the lock; want the lock in its progress", got[1])
	}
}

func TestUpdatedProxyIsReadDirectly(t *testing.T) {
	f, rs := steadyFleet(t, 2)
	poll(t, rs)
	r := rs[0]
	r.req.Proxy.AllowedClientCIDRs = []string{"10.1.0.0/16"}
	if _, err := r.drv.Update(context.Background(), r.ref(), r.req); err != nil {
		t.Fatal(err)
	}
	f.fake.ResetRequests()
	inst, err := r.drv.Get(context.Background(), r.ref())
	if err != nil {
		t.Fatal(err)
	}
	if inst.SpecHash == proxy.Hash(r.req) && inst.State == proxy.StateRunning {
		return // the new seed is applied: fine either way, as long as it was read
	}
	if n := len(f.fake.Requests()); n < 2 {
		t.Errorf("the Get after an Update sent %d requests (%v); want a direct read of the VM", n, endpoints(f.fake.Requests()))
	}
}
