//go:build linux

package forwarding

import (
	"os"
	"path/filepath"
	"testing"
)

// stand in replaces the setting and the records with files of the test's.
func standIn(t *testing.T, value string) {
	t.Helper()
	d := t.TempDir()
	oldDir, oldSysctl := Dir, sysctl
	Dir, sysctl = filepath.Join(d, "records"), filepath.Join(d, "ip_forward")
	t.Cleanup(func() { Dir, sysctl = oldDir, oldSysctl })
	set(t, value)
}

func set(t *testing.T, v string) {
	t.Helper()
	if err := os.WriteFile(sysctl, []byte(v+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func value(t *testing.T) string {
	t.Helper()
	v, err := read(sysctl)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func take(t *testing.T, purpose string) *Hold {
	t.Helper()
	h, err := Take(purpose)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestTheLastToLetGoPutsItBack: two parts hold forwarding at once (a node
// and a test's NAT network, in either order); the first to let go leaves
// it on for the other, the last puts back the machine's 0.
func TestTheLastToLetGoPutsItBack(t *testing.T) {
	standIn(t, "0")
	node := take(t, "node")
	if value(t) != "1" {
		t.Fatalf("ip_forward %s after a Take; want 1", value(t))
	}
	nat := take(t, "kvm-nat")
	if err := node.Release(false); err != nil {
		t.Fatal(err)
	}
	if value(t) != "1" || !Held() {
		t.Fatalf("ip_forward %s (held %v) after the first of two let go; want 1, still held", value(t), Held())
	}
	if err := nat.Release(false); err != nil {
		t.Fatal(err)
	}
	if value(t) != "0" || Held() {
		t.Errorf("ip_forward %s (held %v) after the last let go; want the machine's 0", value(t), Held())
	}
	if _, err := os.Stat(filepath.Join(Dir, "before")); !os.IsNotExist(err) {
		t.Errorf("the record of the machine's value outlived the last hold: %v", err)
	}
}

// TestWhatItFoundStays: forwarding on before any hold stays on; turned
// off by someone else meanwhile, it stays off; a release asked to leave
// it on (a network of the machine's forwards) does.
func TestWhatItFoundStays(t *testing.T) {
	for _, tc := range []struct {
		name, before, meanwhile string
		leaveOn                 bool
		want                    string
	}{
		{"OnBefore", "1", "", false, "1"},
		{"TurnedOffSince", "0", "0", false, "0"},
		{"LeftOnForAnother", "0", "", true, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			standIn(t, tc.before)
			h := take(t, "node")
			if tc.meanwhile != "" {
				set(t, tc.meanwhile)
			}
			if err := h.Release(tc.leaveOn); err != nil {
				t.Fatal(err)
			}
			if value(t) != tc.want {
				t.Errorf("ip_forward %s after the release; want %s", value(t), tc.want)
			}
		})
	}
}

// TestLeftOnForTheMachineByAHoldThatWasNotLast: a release that says the
// machine's own network needs forwarding, while another hold stays, is
// not lost: the last one leaves forwarding on.
func TestLeftOnForTheMachineByAHoldThatWasNotLast(t *testing.T) {
	standIn(t, "0")
	node, nat := take(t, "node"), take(t, "kvm-nat")
	if err := nat.Release(true); err != nil {
		t.Fatal(err)
	}
	if err := node.Release(false); err != nil {
		t.Fatal(err)
	}
	if value(t) != "1" {
		t.Errorf("ip_forward %s; want 1: a network of the machine's needs it", value(t))
	}
}

// TestAKilledHolderCountsForNothing: a hold whose process is gone (a
// killed test) neither keeps forwarding on for ever nor loses the
// machine's value: the next Take keeps the value it recorded, and a Sweep
// with no live hold puts it back.
func TestAKilledHolderCountsForNothing(t *testing.T) {
	standIn(t, "0")
	h := take(t, "node")
	// The hold as a killed process of a pid no process has left it.
	if err := os.WriteFile(h.file, []byte("2147483646 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if Held() {
		t.Fatal("a dead process's hold counts as held")
	}
	again := take(t, "node")
	if err := again.Release(false); err != nil {
		t.Fatal(err)
	}
	if value(t) != "0" {
		t.Errorf("ip_forward %s after a killed holder and a second, released; want the machine's 0 (not the 1 the killed one left)", value(t))
	}
	killed := take(t, "node")
	if err := os.WriteFile(killed.file, []byte("2147483646 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Sweep(); err != nil {
		t.Fatal(err)
	}
	if value(t) != "0" {
		t.Errorf("ip_forward %s after a sweep of a killed holder; want 0", value(t))
	}
}

// TestPutBackHandsTheValueToTheHolds: a value recorded outside the holds
// (an earlier version's node record) goes back at once when nothing holds
// forwarding, and otherwise becomes the one the last hold puts back.
func TestPutBackHandsTheValueToTheHolds(t *testing.T) {
	standIn(t, "1")
	if err := PutBack("0"); err != nil {
		t.Fatal(err)
	}
	if value(t) != "0" {
		t.Errorf("ip_forward %s after PutBack(0) with no hold; want 0", value(t))
	}
	set(t, "1") // turned on by what recorded 0, before the hold below
	h := take(t, "node")
	if now, machine, held, err := State(); err != nil || now != "1" || machine != "1" || !held {
		t.Fatalf("State() = %s, %s, %v, %v; want 1, 1 (what the hold found), held", now, machine, held, err)
	}
	if err := PutBack("0"); err != nil {
		t.Fatal(err)
	}
	if now, machine, _, _ := State(); now != "1" || machine != "0" {
		t.Errorf("State() after PutBack(0) while held = %s, %s; want on now, the machine's 0 to put back", now, machine)
	}
	if err := h.Release(false); err != nil {
		t.Fatal(err)
	}
	if value(t) != "0" {
		t.Errorf("ip_forward %s after the last hold let go; want the machine's 0", value(t))
	}
}
