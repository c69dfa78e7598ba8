//go:build linux

package controlplane

import (
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
// does not name; a live test's record is its own.
func TestLookalikesOfAKilledTestAreSweptIntegration(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: it plants network namespaces")
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
	recordFile := lookalikesRecord(dead.Process.Pid)
	if err := os.WriteFile(recordFile, []byte(record), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := sweepLookalikes(); err != nil {
		t.Fatalf("sweepLookalikes: %v", err)
	}
	<-exited
	if fileExists("/run/netns/"+netns) || fileExists(dir) || fileExists(recordFile) {
		t.Errorf("after the sweep: netns %v, folder %v, record %v; want all gone", fileExists("/run/netns/"+netns), fileExists(dir), fileExists(recordFile))
	}
	if !fileExists(kept) {
		t.Error("a folder the record does not name is gone")
	}

	live := lookalikesRecord(os.Getpid())
	start, _ = procStartTime(os.Getpid())
	if err := os.WriteFile(live, []byte(fmt.Sprintf("owner %d %d\ndir %s\n", os.Getpid(), start, kept)), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(live)
	if err := sweepLookalikesOf(live); err != nil || !fileExists(kept) {
		t.Errorf("sweep of a record whose owner runs: %v, folder kept %v; want it left alone", err, fileExists(kept))
	}
}
