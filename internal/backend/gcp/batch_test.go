package gcp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// steadyFleet creates n proxies, settles them and observes each once (a
// direct read: what makes a proxy steady).
func steadyFleet(t *testing.T, f *fixture, n int) ([]proxy.Request, []proxy.Ref) {
	t.Helper()
	var reqs []proxy.Request
	var refs []proxy.Ref
	for i := range n {
		req := request(fmt.Sprintf("pt-fleet-%02d", i), fmt.Sprintf("0c8f6a1e-1111-4e2a-9c3f-%012d", i))
		inst, err := f.driver.Create(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		reqs, refs = append(reqs, req), append(refs, refOf(inst, req))
	}
	f.srv.SettleAll()
	for i := range refs {
		for range 3 { // until the operation is followed to its end
			if _, err := observe(t, f.driver, &refs[i]); err != nil {
				t.Fatal(err)
			}
		}
		if refs[i].Operation != "" {
			t.Fatalf("%s still follows %s", refs[i].Name, refs[i].Operation)
		}
	}
	return reqs, refs
}

func pollAll(t *testing.T, f *fixture, refs []proxy.Ref) []proxy.Instance {
	t.Helper()
	var out []proxy.Instance
	for i := range refs {
		inst, err := observe(t, f.driver, &refs[i])
		if err != nil {
			t.Fatalf("Get %s: %v", refs[i].Name, err)
		}
		out = append(out, inst)
	}
	return out
}

func TestSteadyProxiesShareOneAggregatedListAPoll(t *testing.T) {
	f := newFixture(t)
	reqs, refs := steadyFleet(t, f, 20)
	for round := range 3 {
		f.srv.ResetRequests()
		for i, inst := range pollAll(t, f, refs) {
			if inst.State != proxy.StateRunning || !inst.ProxyReachable || inst.IP == "" || inst.SpecHash != proxy.Hash(reqs[i]) {
				t.Fatalf("round %d: %s = %+v; want Running, reachable, with its address and spec", round, reqs[i].Name, inst)
			}
		}
		got := f.srv.Requests()
		if len(got) != 1 || !strings.HasPrefix(got[0], "GET aggregated/instances") {
			t.Errorf("round %d: a poll of 20 steady proxies sent %q; want one aggregated listing", round, got)
		}
	}
	if v := f.srv.Violations(); len(v) > 0 {
		t.Errorf("the listing broke the discovery document: %v", v)
	}
}

// An Observe never answers from a listing taken before that proxy's
// previous Observe began: a change made before a poll is seen at the
// latest by the poll after it (the poll right after the change may be
// served by a listing taken between the two, at most ObserveMaxAge old).
func TestSteadyProxySeesAChangeByTheSecondPollAfterIt(t *testing.T) {
	f := newFixture(t)
	_, refs := steadyFleet(t, f, 3)
	pollAll(t, f, refs)
	if err := f.srv.SetStatus(refs[0].ID, "TERMINATED"); err != nil {
		t.Fatal(err)
	}
	pollAll(t, f, refs) // began after the change
	got := pollAll(t, f, refs)
	if got[0].State != proxy.StateStopped {
		t.Errorf("a stopped instance reads %s two polls after the change; want Stopped", got[0].State)
	}
	if got[1].State != proxy.StateRunning {
		t.Errorf("another reads %s; want Running", got[1].State)
	}
	// Not steady any more: read directly from now on.
	f.srv.ResetRequests()
	if _, err := observe(t, f.driver, &refs[0]); err != nil {
		t.Fatal(err)
	}
	if got := f.srv.Requests(); len(got) != 1 || !strings.HasPrefix(got[0], "GET zones/") {
		t.Errorf("the stopped proxy's next Get sent %q; want its own instances.get", got)
	}
}

func TestProxyBeingDeletedIsReadDirectly(t *testing.T) {
	f := newFixture(t)
	_, refs := steadyFleet(t, f, 2)
	pollAll(t, f, refs)
	ref := refs[0]
	ref.Deleting = true
	f.srv.ResetRequests()
	if _, err := f.driver.Get(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	if got := f.srv.Requests(); len(got) != 1 || !strings.HasPrefix(got[0], "GET zones/") {
		t.Errorf("a Get of a proxy being deleted sent %q; want its own instances.get", got)
	}
}
