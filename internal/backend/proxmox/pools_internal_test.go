package proxmox

import (
	"fmt"
	"testing"
	"time"
)

// TestTransportsDropIdleOnes: a transport no config used for
// transportIdle (a deleted config, a rotated CA) is closed and forgotten.
func TestTransportsDropIdleOnes(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := &Transports{now: func() time.Time { return clock }}
	for _, insecure := range []bool{false, true} {
		if _, err := p.get(nil, insecure, nil); err != nil {
			t.Fatal(err)
		}
	}
	clock = clock.Add(transportIdle / 2)
	if _, err := p.get(nil, false, nil); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(transportIdle/2 + time.Minute)
	if _, err := p.get(nil, false, nil); err != nil {
		t.Fatal(err)
	}
	if got := p.size(); got != 1 {
		t.Errorf("%d transports pooled after one went unused for longer than %v; want 1", got, transportIdle)
	}
}

// TestFactsOfGoneVMsAreDropped: what is remembered about a VM goes with
// the VM, seen gone in the next listing of the cluster.
func TestFactsOfGoneVMsAreDropped(t *testing.T) {
	var s Shared
	const url = "https://pve.example:8006"
	s.setFact(factKey{url: url, vmid: 100, uid: "u1", spec: "s"}, facts{port: 3128})
	s.setFact(factKey{url: url, vmid: 101, uid: "u2", spec: "s"}, facts{port: 3128})
	s.setFact(factKey{url: "https://other.example:8006", vmid: 100, uid: "u3", spec: "s"}, facts{port: 3128})
	s.forgetClones(url, []Resource{{Type: "qemu", VMID: 101, Name: "b"}})
	if _, ok := s.fact(factKey{url: url, vmid: 100, uid: "u1", spec: "s"}); ok {
		t.Error("the facts of VM 100, gone from the listing, are kept")
	}
	if _, ok := s.fact(factKey{url: url, vmid: 101, uid: "u2", spec: "s"}); !ok {
		t.Error("the facts of VM 101, still listed, are gone")
	}
	if got := s.factCount(); got != 2 {
		t.Errorf("%d facts kept; want 2 (VM 101 here, VM 100 of the other cluster)", got)
	}
}

// TestRefusedCAsLeaveNothingPooled: a CA Secret that holds no certificate
// (a tenant's caSecretRef, rewritten at will) is refused and leaves
// nothing in the pool, however many distinct ones come.
func TestRefusedCAsLeaveNothingPooled(t *testing.T) {
	p := &Transports{}
	for i := range 100 {
		if _, err := p.get(fmt.Appendf(nil, "not a certificate %d", i), false, nil); err == nil {
			t.Fatal("a CA holding no certificate was accepted")
		}
	}
	if _, err := p.get(nil, false, nil); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.used) != 1 || len(p.m) != 1 || len(p.keys) != 1 {
		t.Errorf("after 100 refused CAs and one good config: %d used, %d transports, %d keys; want 1 each", len(p.used), len(p.m), len(p.keys))
	}
}

// TestInsecureWarningsAreBounded: the warning that a config skips TLS
// verification is logged once per config, and what remembers it does
// not grow with every config ever named.
func TestInsecureWarningsAreBounded(t *testing.T) {
	var s Shared
	if !s.warnOnce("insecure team-a/pve") || s.warnOnce("insecure team-a/pve") {
		t.Error("the warning of one config is not logged exactly once")
	}
	for i := range 3 * warnedKept {
		s.warnOnce(fmt.Sprintf("insecure team-%d/pve", i))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.warned) > warnedKept {
		t.Errorf("%d configs remembered as warned about; want at most %d", len(s.warned), warnedKept)
	}
}
