package kvmtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// DataDir is the folder hack/libvirt-up.sh keeps its data in
// ($EGRESSPROXY_LIBVIRT_DATA, /var/lib/egressproxy-libvirt by default):
// its DATA line, or else the folder of its pool's (POOL_DIR).
func (h *Host) DataDir() string {
	if d := h.Values["DATA"]; d != "" {
		return d
	}
	return filepath.Dir(h.Values["POOL_DIR"])
}

// PoolDir is the folder of a test's own pool named name: DATA/pools/name,
// the project's by its place (hack/libvirt-down.sh unmounts and removes
// what is left in DATA/pools once no test runs).
func (h *Host) PoolDir(name string) string {
	return filepath.Join(h.DataDir(), "pools", name)
}

// TmpfsPool makes a test's own directory pool named name on a tmpfs of
// sizeMiB mounted on PoolDir(name), and returns the folder. The pool is
// transient (virsh pool-create-as): nothing is written into /etc/libvirt,
// and it goes with the libvirtd it runs on. What a killed run left of a
// pool of that name (domains with disks in its folder, the pool, the
// mount) is removed first: it can only be a test's, by its name and
// place. The test's end removes it all.
func (h *Host) TmpfsPool(t *testing.T, name string, sizeMiB int) string {
	t.Helper()
	if err := h.removePool(name); err != nil {
		t.Fatalf("removing what an earlier run left of pool %s: %v", name, err)
	}
	dir := h.PoolDir(name)
	// qemu runs as its own user and must reach the disks.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil { //nolint:gosec // a folder qemu enters.
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if err := h.removePool(name); err != nil {
			t.Errorf("removing pool %s: %v", name, err)
		}
		_ = os.Remove(dir)
		_ = os.Remove(filepath.Dir(dir)) // once no other pool is there
	})
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(sizeMiB)+"M,mode=0711", poolMountSource, dir).CombinedOutput(); err != nil {
		Unavailable(t, "a tmpfs for a small pool", fmt.Errorf("mount: %w: %s", err, out))
	}
	h.Virsh(t, "pool-create-as", name, "dir", "--target", dir)
	return dir
}

// poolMountSource names the tmpfs of TmpfsPool in the mount table;
// earlierPoolMountSource is the one an earlier version mounted in the
// test's temporary folder.
const (
	poolMountSource        = "egressproxy-test-pool"
	earlierPoolMountSource = "egp-hf-small"
)

// removePool removes the domains whose disks are in PoolDir(name) (a
// test's, left running by a killed run), the pool of that name (and its
// persistent definition, which an earlier version made), and the tmpfs
// mounts on its folder. An earlier version mounted the tmpfs (named
// earlierPoolMountSource) in the test's temporary folder: those, and the
// domains with disks there, go too.
func (h *Host) removePool(name string) error {
	dir := h.PoolDir(name)
	virsh := func(args ...string) (string, error) {
		out, err := exec.Command("virsh", append([]string{"-c", "qemu:///system"}, args...)...).CombinedOutput()
		return string(out), err
	}
	ours := func(m mount) bool {
		return m.point == dir && m.source == poolMountSource ||
			m.source == earlierPoolMountSource && strings.HasPrefix(m.point, filepath.Join(os.TempDir(), "Test"))
	}
	places := []string{dir}
	for _, m := range tmpfsMounts() {
		if ours(m) && m.point != dir {
			places = append(places, m.point)
		}
	}
	out, err := virsh("list", "--all", "--name")
	if err != nil {
		return fmt.Errorf("virsh list: %w: %s", err, out)
	}
	for _, d := range strings.Fields(out) {
		blk, err := virsh("domblklist", d)
		if err == nil && slices.ContainsFunc(places, func(p string) bool { return strings.Contains(blk, p+"/") }) {
			_, _ = virsh("destroy", d)
			_, _ = virsh("undefine", "--nvram", d)
		}
	}
	_, _ = virsh("pool-destroy", name)
	_, _ = virsh("pool-undefine", name)
	if out, err := virsh("pool-info", name); err == nil {
		return fmt.Errorf("pool %s is still there: %s", name, out)
	}
	var errs []error
	for _, m := range tmpfsMounts() {
		if ours(m) {
			if err := unmountAll(m.point); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

type mount struct{ point, source string }

// tmpfsMounts are this machine's tmpfs mounts.
func tmpfsMounts() []mount {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	unescape := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	var out []mount
	for _, l := range strings.Split(string(b), "\n") {
		_, after, ok := strings.Cut(l, " - ")
		f, a := strings.Fields(l), strings.Fields(after)
		if !ok || len(f) < 5 || len(a) < 2 || a[0] != "tmpfs" {
			continue
		}
		out = append(out, mount{point: unescape.Replace(f[4]), source: unescape.Replace(a[1])})
	}
	return out
}

// unmountAll unmounts the tmpfs mounts on dir (stacked ones too), lazily
// when one is busy.
func unmountAll(dir string) error {
	mounted := func() bool {
		return slices.ContainsFunc(tmpfsMounts(), func(m mount) bool { return m.point == dir })
	}
	for range 16 {
		if !mounted() {
			return nil
		}
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			if out2, err2 := exec.Command("umount", "-l", dir).CombinedOutput(); err2 != nil {
				return fmt.Errorf("umount %s: %w: %s; umount -l: %w: %s", dir, err, out, err2, out2)
			}
		}
	}
	return fmt.Errorf("umount %s: still mounted", dir)
}
