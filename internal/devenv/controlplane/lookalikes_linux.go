//go:build linux

package controlplane

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// lookalikes are what another Kubernetes, Docker or Squid on a developer's
// machine keeps where a careless node would look: a process in a
// kubepods cgroup, kubelet and CNI chains with rules jumping to them, an
// idle cni-* network namespace, a containerd on its default socket and a
// squid. The test plants them and removes what it planted. Since they
// carry other products' names, what it planted is also written to
// a record of its own (lookalikesRecord) as it goes: a test killed before
// its clean-up leaves a record the next planting uses to remove them
// (sweepLookalikes).
type lookalikes struct {
	record        *os.File
	cgroupProc    *exec.Cmd
	cgroupDir     string
	chains        [][3]string // iptables, table, chain
	jumps         [][]string  // iptables arguments after -t TABLE -A
	netns         string
	socket        string
	listener      net.Listener
	services      []*exec.Cmd
	cleanups      []func()
	cgroupCreated []string
}

// PlantLookalikes plants the look-alikes (root; Linux), removed when the
// test ends, and returns what reports those gone or changed. Plant them
// holding the node lock (LockNode), so that no node runs meanwhile.
func PlantLookalikes(t testing.TB) (check func() []string) {
	return plantLookalikes(t).check
}

func plantLookalikes(t testing.TB) *lookalikes {
	t.Helper()
	if err := sweepLookalikes(); err != nil {
		t.Fatal(err)
	}
	rec, err := os.OpenFile(lookalikesRecord(os.Getpid()), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatalf("recording the look-alikes: %v", err)
	}
	start, _ := procStartTime(os.Getpid())
	fmt.Fprintf(rec, "owner %d %d\n", os.Getpid(), start)
	l := &lookalikes{record: rec}
	t.Cleanup(l.remove)
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	suffix := hex.EncodeToString(id)

	// A pod of another kubelet: cgroup v2's kubepods.slice, or v1's
	// /kubepods in the pids hierarchy (any one the node would sweep).
	var dir string
	if fileExists(filepath.Join(cgroupFS, "cgroup.controllers")) {
		dir = filepath.Join(cgroupFS, "kubepods.slice", "kubepods-besteffort.slice", "kubepods-besteffort-podlookalike"+suffix+".slice")
	} else {
		h := filepath.Join(cgroupFS, "pids")
		if !fileExists(filepath.Join(h, "cgroup.procs")) {
			ents, _ := os.ReadDir(cgroupFS)
			for _, e := range ents {
				if p := filepath.Join(cgroupFS, e.Name()); fileExists(filepath.Join(p, "cgroup.procs")) {
					h = p
					break
				}
			}
		}
		dir = filepath.Join(h, "kubepods", "besteffort", "podlookalike"+suffix)
	}
	for p := dir; p != cgroupFS && !fileExists(p); p = filepath.Dir(p) {
		l.cgroupCreated = append(l.cgroupCreated, p)
	}
	// Outermost first: the sweep goes through the record backwards.
	for i := len(l.cgroupCreated) - 1; i >= 0; i-- {
		l.note("cgroup", l.cgroupCreated[i])
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("planting a foreign kubepods cgroup: %v", err)
	}
	l.cgroupDir = dir
	l.cgroupProc = l.startSleep(t, "sleep")
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(l.cgroupProc.Process.Pid)), 0o644); err != nil {
		t.Fatalf("moving a sleep into %s: %v", dir, err)
	}

	// Another kubelet's firewall chain and a CNI firewall plugin's chain,
	// each with a rule jumping to it (empty chains: they return at once).
	for _, c := range [][2]string{{kubeletChains[0], "INPUT"}, {"CNI-FORWARD", "FORWARD"}} {
		chain, from := c[0], c[1]
		if !slices.Contains(chainsOf(iptablesSave("iptables", "filter")), chain) {
			if out, err := exec.Command("iptables", "-w", "-t", "filter", "-N", chain).CombinedOutput(); err != nil {
				t.Fatalf("iptables -N %s: %v: %s", chain, err, out)
			}
			l.cleanups = append(l.cleanups, func() { _ = exec.Command("iptables", "-w", "-t", "filter", "-X", chain).Run() })
			l.note("chain", chain)
		}
		// Marked as the test's: a sweep of a killed test's record deletes
		// this rule, never another kubelet's identical one.
		jump := []string{from, "-m", "comment", "--comment", lookalikeComment, "-j", chain}
		if exec.Command("iptables", append([]string{"-w", "-t", "filter", "-C"}, jump...)...).Run() != nil {
			if out, err := exec.Command("iptables", append([]string{"-w", "-t", "filter", "-A"}, jump...)...).CombinedOutput(); err != nil {
				t.Fatalf("iptables -A %v: %v: %s", jump, err, out)
			}
			// Before the chain's -X, registered above.
			l.cleanups = append(l.cleanups, func() { _ = exec.Command("iptables", append([]string{"-w", "-t", "filter", "-D"}, jump...)...).Run() })
			l.note(append([]string{"jump"}, jump...)...)
		}
		l.chains = append(l.chains, [3]string{"iptables", "filter", chain})
		l.jumps = append(l.jumps, jump)
	}

	// Another containerd's idle pod network namespace.
	l.netns = "cni-" + suffix + "-0000-4000-8000-lookalike0000"
	if out, err := exec.Command("ip", "netns", "add", l.netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", l.netns, err, out)
	}
	l.cleanups = append(l.cleanups, func() { _ = exec.Command("ip", "netns", "delete", l.netns).Run() })
	l.note("netns", l.netns)

	// Docker's containerd on its default socket, unless a real one is
	// there (then that one must survive), and a system squid.
	l.socket = "/run/containerd/containerd.sock"
	if _, err := os.Stat(l.socket); errors.Is(err, os.ErrNotExist) {
		if !fileExists(filepath.Dir(l.socket)) {
			if err := os.Mkdir(filepath.Dir(l.socket), 0o711); err != nil {
				t.Fatal(err)
			}
			l.cleanups = append(l.cleanups, func() { _ = os.Remove(filepath.Dir(l.socket)) })
			l.note("dir", filepath.Dir(l.socket))
		}
		// Noted before it exists, and again with its inode once it does:
		// a test killed in between leaves a line the sweep can act on, and
		// the inode tells the planted socket from one a containerd started
		// since has made there (plantedSocketGone).
		l.note("socket", l.socket)
		ln, err := net.Listen("unix", l.socket)
		if err != nil {
			t.Fatalf("standing in for a containerd on %s: %v", l.socket, err)
		}
		l.listener = ln
		dev, ino, ok := socketInode(l.socket)
		if !ok {
			t.Fatalf("reading the inode of the planted socket %s", l.socket)
		}
		l.note("socket", l.socket, strconv.FormatUint(dev, 10), strconv.FormatUint(ino, 10))
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.Close()
			}
		}()
		l.services = append(l.services, l.startSleep(t, "containerd"))
	}
	l.services = append(l.services, l.startSleep(t, "containerd-shim-runc-v2"), l.startSleep(t, "squid"))
	return l
}

// lookalikesRecord is the record of the look-alikes a process planted,
// one per line: its PID and start time first, then what was made, in
// order.
func lookalikesRecord(pid int) string { return lookalikesPrefix + strconv.Itoa(pid) }

const lookalikesPrefix = "/run/egressproxy-lookalikes."

// lookalikeComment marks the iptables rules the test plants (-m comment).
const lookalikeComment = "egressproxy-lookalike"

// plantedJump returns a record's "jump" arguments when they name a rule
// the test planted (its comment, lookalikeComment), so that deleting them
// deletes that rule only. An older record's jump without the comment is
// the same text as another kubelet's rule and is left alone.
func plantedJump(args []string) ([]string, bool) {
	for i := 0; i+3 < len(args); i++ {
		if args[i] == "-m" && args[i+1] == "comment" && args[i+2] == "--comment" && args[i+3] == lookalikeComment {
			return args, true
		}
	}
	return nil, false
}

// note records one planted thing.
func (l *lookalikes) note(fields ...string) {
	fmt.Fprintln(l.record, strings.Join(fields, " "))
	_ = l.record.Sync()
}

// sweepLookalikes removes what killed tests planted, by their records:
// only those whose owner is gone (a live owner's are its own to remove).
func sweepLookalikes() error {
	records, err := filepath.Glob(lookalikesPrefix + "*")
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range records {
		errs = append(errs, sweepLookalikesOf(r))
	}
	return errors.Join(errs...)
}

// sweepLookalikesOf removes what one record names, unless its owner runs.
func sweepLookalikesOf(record string) error {
	b, err := os.ReadFile(record)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(lines[0], "owner %d %d", &pid, &start); err == nil {
		if st, ok := procStartTime(pid); ok && st == start {
			return nil
		}
	}
	// A socket whose inode was noted is removed by that line alone: the
	// line noted before it was made speaks for a socket that may not be
	// the test's.
	withInode := map[string]bool{}
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "socket" {
			withInode[f[1]] = true
		}
	}
	// In reverse: jumps before their chains, cgroups' processes before
	// the cgroups, the deepest cgroup first.
	for i := len(lines) - 1; i >= 1; i-- {
		f := strings.Fields(lines[i])
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "proc":
			p, _ := strconv.Atoi(f[1])
			if st, ok := procStartTime(p); ok && len(f) > 2 && strconv.FormatUint(st, 10) == f[2] {
				_ = syscall.Kill(p, syscall.SIGKILL)
				waitGone([]int{p}, 5*time.Second)
			}
		case "jump":
			if args, ok := plantedJump(f[1:]); ok {
				_ = exec.Command("iptables", append([]string{"-w", "-t", "filter", "-D"}, args...)...).Run()
			}
		case "chain":
			_ = exec.Command("iptables", "-w", "-t", "filter", "-X", f[1]).Run()
		case "netns":
			_ = exec.Command("ip", "netns", "delete", f[1]).Run()
		case "socket":
			if len(f) != 4 && withInode[f[1]] {
				continue
			}
			if removable(f[1], f[2:]) {
				_ = os.Remove(f[1])
			}
		case "dir", "cgroup":
			_ = syscall.Rmdir(f[1])
		}
	}
	return os.Remove(record)
}

// removable says whether the socket a record line names (path, then the
// device and inode noted when it was planted, if they were) is still the
// one planted: a socket nobody listens on (a dial fails) and, when the
// inode was noted, that very inode. A containerd started since a test was
// killed has made its own socket there, listening; one stopped since has
// left its own, of another inode. Neither is removed. Without a noted
// inode (a test killed as it planted the socket, or a record of an earlier
// version) a socket nobody listens on is taken for the test's.
func removable(path string, inode []string) bool {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		return false
	}
	if len(inode) == 2 {
		dev, ino, ok := socketInode(path)
		if !ok || strconv.FormatUint(dev, 10) != inode[0] || strconv.FormatUint(ino, 10) != inode[1] {
			return false
		}
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close()
		return false
	}
	return true
}

// socketInode is the device and inode of the socket at path.
func socketInode(path string) (dev, ino uint64, ok bool) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		return 0, 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return uint64(st.Dev), st.Ino, true //nolint:unconvert // Dev is not uint64 on every Linux architecture.
}

// startSleep starts a sleep whose command line names it argv0: a process
// standing in for another's, noted at once (a test killed right after
// leaves no process the record does not name).
func (l *lookalikes) startSleep(t testing.TB, argv0 string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	cmd.Args[0] = argv0
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	st, _ := procStartTime(cmd.Process.Pid)
	l.note("proc", strconv.Itoa(cmd.Process.Pid), strconv.FormatUint(st, 10))
	return cmd
}

// check reports the look-alikes that are gone or changed.
func (l *lookalikes) check() []string {
	var gone []string
	alive := func(what string, cmd *exec.Cmd) {
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			gone = append(gone, fmt.Sprintf("%s (pid %d): %v", what, cmd.Process.Pid, err))
		}
	}
	alive("the process in the foreign cgroup "+l.cgroupDir, l.cgroupProc)
	if b, err := os.ReadFile(filepath.Join(l.cgroupDir, "cgroup.procs")); err != nil || !slices.Contains(strings.Fields(string(b)), strconv.Itoa(l.cgroupProc.Process.Pid)) {
		gone = append(gone, fmt.Sprintf("cgroup %s or the sleep in it (%v)", l.cgroupDir, err))
	}
	for _, c := range l.chains {
		if !slices.Contains(chainsOf(iptablesSave(c[0], c[1])), c[2]) {
			gone = append(gone, fmt.Sprintf("%s chain %s/%s", c[0], c[1], c[2]))
		}
	}
	for _, j := range l.jumps {
		if out, err := exec.Command("iptables", append([]string{"-w", "-t", "filter", "-C"}, j...)...).CombinedOutput(); err != nil {
			gone = append(gone, fmt.Sprintf("iptables rule %v: %s", j, strings.TrimSpace(string(out))))
		}
	}
	if !fileExists("/run/netns/" + l.netns) {
		gone = append(gone, "network namespace "+l.netns)
	}
	if c, err := net.DialTimeout("unix", l.socket, time.Second); err != nil && l.listener != nil {
		gone = append(gone, fmt.Sprintf("the containerd socket %s: %v", l.socket, err))
	} else if err == nil {
		_ = c.Close()
	}
	for _, s := range l.services {
		alive(s.Args[0], s)
	}
	return gone
}

func (l *lookalikes) remove() {
	defer func() {
		_ = l.record.Close()
		_ = os.Remove(lookalikesRecord(os.Getpid()))
	}()
	for _, s := range append(l.services, l.cgroupProc) {
		if s != nil {
			_ = s.Process.Kill()
		}
	}
	if l.listener != nil {
		_ = l.listener.Close() // removes the socket
	}
	if l.cgroupProc != nil {
		waitGone([]int{l.cgroupProc.Process.Pid}, 5*time.Second)
	}
	for _, d := range l.cgroupCreated {
		_ = syscall.Rmdir(d)
	}
	for i := len(l.cleanups) - 1; i >= 0; i-- {
		l.cleanups[i]()
	}
}
