package proxytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func TestMemoryFailNext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := NewMemory("lab", "inst")
	req := m.Request("a", "uid-a")

	m.FailNext(OpCreate, proxy.Quotaf("out of addresses"))
	m.FailNext(OpCreate, errors.New("connection reset"))
	_, err := m.Create(ctx, req)
	var pe *proxy.Error
	if !errors.As(err, &pe) || pe.Class != proxy.ClassQuota || pe.Provider != "lab" || pe.Op != OpCreate {
		t.Errorf("first Create = %#v; want Quota from provider lab, op create", err)
	}
	if _, err := m.Create(ctx, req); !proxy.IsTransient(err) || err == nil {
		t.Errorf("second Create = %v; want the unclassified error as Transient", err)
	}
	if _, err := m.Create(ctx, req); err != nil {
		t.Errorf("third Create = %v; want success once the queue is empty", err)
	}

	m.FailNext(OpCheck, errors.New("401 Unauthorized"))
	if h := m.Check(ctx); h.Healthy() || h.Targets[0].Reason != proxy.ReasonAPIError {
		t.Errorf("Check after FailNext(check) = %+v; want unhealthy with a reason", h)
	}
	if h := m.Check(ctx); !h.Healthy() || h.Targets[0].Target != MemoryTarget {
		t.Errorf("Check = %+v; want one healthy %q target", h, MemoryTarget)
	}

	for _, bad := range []struct {
		op  string
		err error
	}{{"reboot", errors.New("x")}, {OpGet, nil}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("FailNext(%q, %v) did not panic", bad.op, bad.err)
				}
			}()
			m.FailNext(bad.op, bad.err)
		}()
	}
}

func TestMemoryCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := NewMemory("lab", "inst")
	req := m.Request("a", "uid-a")
	inst, _ := m.Create(ctx, req)
	_, _ = m.Get(ctx, proxy.Ref{ID: inst.ID})
	_, _ = m.Get(ctx, proxy.Ref{Name: "a"})
	_, _ = m.Update(ctx, proxy.Ref{ID: inst.ID}, req)
	_, _ = m.List(ctx, "inst")
	m.Check(ctx)
	_ = m.Delete(ctx, proxy.Ref{ID: inst.ID})
	want := []string{"create a", "get memory/a", "get a", "update memory/a", "list inst", "check", "delete memory/a"}
	if diff := cmp.Diff(want, m.Calls()); diff != "" {
		t.Errorf("Calls (-want +got):\n%s", diff)
	}
}

func TestMemoryLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := NewMemory("lab", "inst")
	a, err := m.Create(ctx, m.Request("a", "uid-a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, m.Request("b", "uid-b"))
	if err != nil {
		t.Fatal(err)
	}
	if a.State != proxy.StateProvisioning || a.IP != "" {
		t.Errorf("after Create: %q %q; want Provisioning without address", a.State, a.IP)
	}
	// Pokes take IDs or names.
	if err := m.Settle(a.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Settle("b"); err != nil {
		t.Fatal(err)
	}
	if err := m.Settle("never-created"); err != nil {
		t.Errorf("Settle of a missing instance = %v; want nil", err)
	}
	var ips []string
	for _, ref := range []proxy.Ref{{ID: a.ID}, {ID: b.ID}} {
		got, err := m.Get(ctx, ref)
		if err != nil || got.State != proxy.StateRunning || !strings.HasPrefix(got.IP, "10.") || !got.ProxyReachable {
			t.Errorf("Get(%s) after Settle = %+v, %v; want Running on 10.x", ref.ID, got, err)
		}
		ips = append(ips, got.IP)
	}
	if ips[0] == ips[1] {
		t.Errorf("both instances got %s", ips[0])
	}

	for _, s := range []proxy.State{proxy.StateStopped, proxy.StateTerminated, proxy.StateRunning} {
		if err := m.SetState(a.ID, s); err != nil {
			t.Fatal(err)
		}
		if got, _ := m.Get(ctx, proxy.Ref{ID: a.ID}); got.State != s || got.IP != ips[0] {
			t.Errorf("after SetState(%s): %q %q; want %q, address kept", s, got.State, got.IP, s)
		}
	}
	if err := m.SetState(a.ID, "Exploded"); err == nil {
		t.Error("SetState to an unknown state succeeded")
	}

	m.Remove(b.ID)
	if _, err := m.Get(ctx, proxy.Ref{ID: b.ID}); !proxy.IsNotFound(err) {
		t.Errorf("Get after Remove = %v; want NotFound", err)
	}
	if diff := cmp.Diff([]string{"a"}, names(m.Instances())); diff != "" {
		t.Errorf("Instances (-want +got):\n%s", diff)
	}
}

func TestMemorySpecIsACopyWithSecrets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := NewMemory("lab", "inst")
	req := secretRequest(m.Request("a", "uid-a"), 1)
	inst, _ := m.Create(ctx, req)
	req.Proxy.AllowedClientCIDRs[0] = "0.0.0.0/0" // the caller changes its copy
	got, ok := m.Spec(inst.ID)
	if !ok || got.Proxy.Auth.Password != sentinelPassword1 || got.Proxy.AllowedClientCIDRs[0] != "10.0.0.0/8" {
		t.Errorf("Spec = %+v, %v; want the request as sent, password included", got, ok)
	}
	if inst.SpecHash != proxy.Hash(got) {
		t.Errorf("SpecHash %q; want Hash(Spec) %q", inst.SpecHash, proxy.Hash(got))
	}
	if strings.Contains(m.Logs(), sentinelPassword1) || !strings.Contains(m.Logs(), "created instance") {
		t.Errorf("Logs = %q; want the creation logged, without the password", m.Logs())
	}
	if err := m.Foreign("human"); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Spec("human"); ok {
		t.Error("Spec of an instance the driver did not create reported ok")
	}
}

func TestMemoryRefusesToDeleteUnmarked(t *testing.T) {
	t.Parallel()
	m := NewMemory("lab", "inst")
	if err := m.Foreign("human"); err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(context.Background(), proxy.Ref{Name: "human"}); !proxy.IsPermanent(err) {
		t.Errorf("Delete of an unmarked instance = %v; want Permanent", err)
	}
	if len(m.Instances()) != 1 {
		t.Error("the unmarked instance was deleted")
	}
}

func TestMemoryUpdateRefusesOtherMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := NewMemory("lab", "inst")
	inst, _ := m.Create(ctx, m.Request("a", "uid-a"))
	if _, err := m.Update(ctx, proxy.Ref{ID: inst.ID}, m.Request("a", "uid-b")); !proxy.IsPermanent(err) {
		t.Errorf("Update with another UID = %v; want Permanent", err)
	}
	if _, err := m.Update(ctx, proxy.Ref{Name: "missing"}, m.Request("missing", "uid-a")); !proxy.IsNotFound(err) {
		t.Errorf("Update of a missing instance = %v; want NotFound", err)
	}
}

func TestMemoryNextIPSkipsNetworkAndBroadcast(t *testing.T) {
	t.Parallel()
	m := &Memory{lastIP: 253}
	got := []string{m.nextIP(), m.nextIP()}
	if diff := cmp.Diff([]string{"10.0.0.254", "10.0.1.1"}, got); diff != "" {
		t.Errorf("nextIP (-want +got):\n%s", diff)
	}
}

// TestMemoryConcurrentUse is for -race.
func TestMemoryConcurrentUse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := NewMemory("lab", "inst")
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			name := fmt.Sprintf("i-%d", i%4)
			inst, err := m.Create(ctx, m.Request(name, "uid-"+name))
			if err != nil {
				t.Errorf("Create(%s): %v", name, err)
				return
			}
			_ = m.Settle(inst.ID)
			_, _ = m.Get(ctx, proxy.Ref{ID: inst.ID})
			_, _ = m.List(ctx, "inst")
			m.Check(ctx)
			m.SetBusy(false)
			_ = m.Calls()
			_ = m.Logs()
		})
	}
	wg.Wait()
	if got := len(m.Instances()); got != 4 {
		t.Errorf("%d instances; want 4", got)
	}
}
