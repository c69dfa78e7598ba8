//go:build linux

package controlplane

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// The sweep of a killed test's record removes the containerd socket it
// planted, and never a socket at that place that is not the planted one:
// one something listens on (a containerd started since), or one of
// another inode (a containerd started and stopped since).
func TestSweepLookalikesRemovesOnlyThePlantedSocket(t *testing.T) {
	dir := t.TempDir()
	// A socket left behind, nobody listening: what a killed test leaves.
	stale := func(path string) {
		t.Helper()
		_ = os.Remove(path)
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		_ = l.Close()
	}
	inode := func(path string) string {
		t.Helper()
		dev, ino, ok := socketInode(path)
		if !ok {
			t.Fatalf("no socket at %s", path)
		}
		return strconv.FormatUint(dev, 10) + " " + strconv.FormatUint(ino, 10)
	}
	// A record whose owner is gone (no process has PID 0).
	sweep := func(lines ...string) {
		t.Helper()
		rec := filepath.Join(dir, "record")
		b := "owner 0 0\n"
		for _, l := range lines {
			b += l + "\n"
		}
		if err := os.WriteFile(rec, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := sweepLookalikesOf(rec); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(rec); err == nil {
			t.Fatal("the record outlived its sweep")
		}
	}
	exists := func(path string) bool { _, err := os.Lstat(path); return err == nil }

	planted := filepath.Join(dir, "planted.sock")
	stale(planted)
	sweep("socket "+planted, "socket "+planted+" "+inode(planted))
	if exists(planted) {
		t.Error("the planted socket, its inode noted, nobody listening, was kept")
	}

	// Killed between noting it and noting its inode: nobody listens.
	half := filepath.Join(dir, "half.sock")
	stale(half)
	sweep("socket " + half)
	if exists(half) {
		t.Error("a socket noted without its inode, nobody listening, was kept")
	}

	// A containerd started since listens on its own socket there.
	live := filepath.Join(dir, "live.sock")
	stale(live)
	old := inode(live)
	_ = os.Remove(live)
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sweep("socket "+live, "socket "+live+" "+old)
	sweep("socket " + live)
	if !exists(live) {
		t.Error("the sweep removed a socket something listens on")
	}

	// A containerd started and stopped since left its own socket there.
	other := filepath.Join(dir, "other.sock")
	stale(other)
	old = inode(other)
	// Anew, the old one kept by another name so its number is not reused.
	if err := os.Link(other, other+".old"); err != nil {
		t.Fatal(err)
	}
	stale(other)
	if inode(other) == old {
		t.Fatal("the new socket got the old inode")
	}
	sweep("socket "+other, "socket "+other+" "+old)
	if !exists(other) {
		t.Error("the sweep removed a socket of another inode than the one planted")
	}

	// Not a socket.
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sweep("socket " + file)
	if !exists(file) {
		t.Error("the sweep removed a file that is no socket")
	}
}
