package controlplane

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pruneStale removes a killed control plane's folder, but not one a
// killed node's record points into, nor one with something mounted below
// it (a killed node's containers' root filesystems and volumes), nor a
// recent one.
func TestPruneStaleKeepsAKilledNodesFolder(t *testing.T) {
	tmp := t.TempDir()
	mk := func(name string, old bool) string {
		d := filepath.Join(tmp, tempPrefix+name)
		if err := os.MkdirAll(filepath.Join(d, "node", "containerd", "state"), 0o755); err != nil {
			t.Fatal(err)
		}
		if old {
			past := time.Now().Add(-time.Hour)
			if err := os.Chtimes(d, past, past); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	stale, recorded, mounted, recent := mk("stale", true), mk("recorded", true), mk("mounted", true), mk("recent", false)
	spaced := mk("with space", true)

	record := filepath.Join(tmp, "node.dir")
	if err := os.WriteFile(record, []byte(filepath.Join(recorded, "node")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	realMounted, err := filepath.EvalSymlinks(mounted)
	if err != nil {
		t.Fatal(err)
	}
	realSpaced, err := filepath.EvalSymlinks(spaced)
	if err != nil {
		t.Fatal(err)
	}
	esc := func(s string) string {
		out := ""
		for _, r := range s {
			if r == ' ' {
				out += `\040`
			} else {
				out += string(r)
			}
		}
		return out
	}
	mountinfo := filepath.Join(tmp, "mountinfo")
	if err := os.WriteFile(mountinfo, []byte(
		"22 1 0:21 / / rw,relatime - ext4 /dev/sda1 rw\n"+
			"901 22 0:90 / "+esc(filepath.Join(realMounted, "node", "containerd", "state", "rootfs"))+" rw - overlay overlay rw\n"+
			"902 22 0:91 / "+esc(filepath.Join(realSpaced, "node", "kubelet", "pods", "v"))+" rw - tmpfs tmpfs rw\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	pruneStaleIn(tmp, record, mountinfo)
	for d, keep := range map[string]bool{stale: false, recorded: true, mounted: true, spaced: true, recent: true} {
		if _, err := os.Stat(d); (err == nil) != keep {
			t.Errorf("%s after pruneStale: %v; want kept %v", filepath.Base(d), err, keep)
		}
	}

	// Once the next node's sweep has unmounted them and recorded its own
	// folder, they go.
	if err := os.WriteFile(record, []byte(filepath.Join(tmp, "elsewhere", "node")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mountinfo, []byte("22 1 0:21 / / rw,relatime - ext4 /dev/sda1 rw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pruneStaleIn(tmp, record, mountinfo)
	for _, d := range []string{recorded, mounted, spaced} {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s kept once nothing of a node was left in it", filepath.Base(d))
		}
	}
}
