//go:build linux

package controlplane

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// A test killed with its look-alikes planted leaves their record; the
// next planting removes what it names (a sleep by its PID and start time,
// a network namespace, a folder) and the record, and nothing the record
// does not name.
func TestLookalikesOfAKilledTestAreSweptIntegration(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: it plants network namespaces")
	}
	// No planting test runs meanwhile: they hold the node lock.
	release, err := LockNode(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := os.Stat(lookalikesFile); err == nil {
		t.Fatalf("%s exists before the test", lookalikesFile)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	sleep := exec.Command("sleep", "600")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleep.Process.Kill() }()
	exited := make(chan struct{})
	go func() { _ = sleep.Wait(); close(exited) }()
	start, _ := procStartTime(sleep.Process.Pid)
	netns := "cni-sweeptest-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	defer func() { _ = exec.Command("ip", "netns", "delete", netns).Run() }()
	dir := filepath.Join(t.TempDir(), "planted")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(t.TempDir(), "not-planted")
	if err := os.Mkdir(kept, 0o755); err != nil {
		t.Fatal(err)
	}
	record := fmt.Sprintf("owner %d 1\ndir %s\nnetns %s\nproc %d %d\n", dead.Process.Pid, dir, netns, sleep.Process.Pid, start)
	if err := os.WriteFile(lookalikesFile, []byte(record), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := sweepLookalikes(); err != nil {
		t.Fatalf("sweepLookalikes: %v", err)
	}
	<-exited
	if fileExists("/run/netns/"+netns) || fileExists(dir) || fileExists(lookalikesFile) {
		t.Errorf("after the sweep: netns %v, folder %v, record %v; want all gone", fileExists("/run/netns/"+netns), fileExists(dir), fileExists(lookalikesFile))
	}
	if !fileExists(kept) {
		t.Error("a folder the record does not name is gone")
	}
}
