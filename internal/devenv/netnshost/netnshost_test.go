package netnshost_test

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/netnshost"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// childEnv makes the test binary a process that makes a host, prints its
// namespace and waits to be killed, as a test binary killed by its
// timeout or by Ctrl-C would be.
const childEnv = "NETNSHOST_TEST_CHILD"

func TestMain(m *testing.M) {
	testenv.RunAsChild(childEnv, func() int {
		h, err := netnshost.New()
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		fmt.Println(h.Netns)
		select {}
	})
	os.Exit(m.Run())
}

func exists(name string) bool {
	_, err := os.Stat("/run/netns/" + name)
	return err == nil
}

// A host whose process died without Close is removed by the next New;
// a host whose process runs, and a namespace this package did not make,
// are left alone.
func TestIntegrationLeftoverOfAKilledProcessIsRemoved(t *testing.T) {
	live := testenv.NewTestHost(t) // skips, or fails under CI, without root

	child := testenv.ChildCommand(childEnv, "^$")
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the child made no host: %v", err)
	}
	leftover := strings.TrimSpace(line)
	if !strings.HasPrefix(leftover, "epx") {
		t.Fatalf("the child made no host: %s", leftover)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", leftover).Run() }) //nolint:gosec // the child's.
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	if !exists(leftover) {
		t.Fatalf("namespace %s went with its killed process: nothing to sweep", leftover)
	}

	foreign := fmt.Sprintf("epxforeign%d", os.Getpid())
	if b, err := exec.Command("ip", "netns", "add", foreign).CombinedOutput(); err != nil { //nolint:gosec // a name made here.
		t.Fatalf("ip netns add: %v: %s", err, b)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", foreign).Run() }) //nolint:gosec // ours.

	next := testenv.NewTestHost(t)

	if exists(leftover) {
		t.Errorf("namespace %s of the killed process is still there after the next New", leftover)
	}
	for _, name := range []string{live.Netns, next.Netns, foreign} {
		if !exists(name) {
			t.Errorf("namespace %s was removed, but its owner runs or it is not this package's", name)
		}
	}
}

// An extra address on a network this machine routes (here, its
// loopback) is refused before anything is made: the host's route would
// take that network's traffic. Unrouted draws another.
func TestExtraAddressOnTheMachinesNetworkIsRefused(t *testing.T) {
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("iproute2's ip is needed")
	}
	if _, err := netnshost.New(netip.MustParseAddr("127.0.0.5")); err == nil || !strings.Contains(err.Error(), "on a network this machine routes") {
		t.Errorf("New with 127.0.0.5 = %v; want a refusal", err)
	}
	n := 0
	got := netnshost.Unrouted(func() netip.Addr {
		n++
		if n == 1 {
			return netip.MustParseAddr("127.0.0.9")
		}
		return netip.MustParseAddr("198.51.100.77")
	})
	if got != netip.MustParseAddr("198.51.100.77") || n != 2 {
		t.Errorf("Unrouted = %s after %d draws; want the second, unrouted one", got, n)
	}
}
