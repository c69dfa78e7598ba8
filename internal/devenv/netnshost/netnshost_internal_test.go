package netnshost

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A slot whose addresses this machine routes already (a fake-IP TUN's
// 198.18.0.0/15) is never taken: with every slot routed, New makes
// nothing and says why.
func TestNewTakesNoRoutedSlot(t *testing.T) {
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no iproute2")
	}
	useOwnersDir(t, t.TempDir())
	defer func(f func(netip.Addr) string) { slotRouteOf = f }(slotRouteOf)
	var asked []netip.Addr
	slotRouteOf = func(a netip.Addr) string {
		asked = append(asked, a)
		return "198.18.0.0/15 dev tun0 scope link"
	}
	h, err := New()
	if err == nil {
		_ = h.Close()
		t.Fatalf("New with every slot routed made host %s", h.Netns)
	}
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "tun0") {
		t.Errorf("New with every slot routed = %v; want ErrUnavailable naming the route", err)
	}
	if len(asked) == 0 || !Net.Contains(asked[0]) {
		t.Errorf("routes looked up for %v; want the slots' addresses", asked)
	}
	if ents, _ := os.ReadDir(ownersDir); len(ents) != 0 {
		t.Errorf("records left: %v", ents)
	}
}

// The record comes before the namespace: a second claim of a name fails,
// and a record whose owner is gone and whose namespace was never made (a
// process killed in between) goes with the next sweep.
func TestClaimComesFirstAndIsSwept(t *testing.T) {
	useOwnersDir(t, t.TempDir())
	name := "epxtest" + filepath.Base(ownersDir)
	if err := claim(name); err != nil {
		t.Fatal(err)
	}
	if err := claim(name); !errors.Is(err, os.ErrExist) {
		t.Errorf("a second claim of %s = %v; want os.ErrExist", name, err)
	}
	sweepLeftovers()
	if _, err := os.Stat(filepath.Join(ownersDir, name)); err != nil {
		t.Errorf("the sweep removed a live owner's record: %v", err)
	}
	// No process has a PID this large.
	if err := os.WriteFile(filepath.Join(ownersDir, name), []byte("2147483647 1"), 0o600); err != nil {
		t.Fatal(err)
	}
	sweepLeftovers()
	if _, err := os.Stat(filepath.Join(ownersDir, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a dead owner's record of a namespace never made: %v; want it removed", err)
	}
}

// useOwnersDir records owners in dir for the test's duration.
func useOwnersDir(t *testing.T, dir string) {
	old := ownersDir
	ownersDir = dir
	t.Cleanup(func() { ownersDir = old })
}
