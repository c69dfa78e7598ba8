// Package kvmtest gives tests a real libvirt host on this machine: Debian's
// libvirtd behind a private sshd on loopback, an isolated network and a
// storage pool, all set up by hack/libvirt-up.sh and torn down by
// hack/libvirt-down.sh (by PID files, once no test process uses them).
//
// Under CI (the CI environment variable set, as make test does) a host
// that cannot be had fails the test; elsewhere the test is skipped with a
// message saying why.
package kvmtest

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// Host is the real libvirt host the scripts brought up.
type Host struct {
	// Values are hack/libvirt-up.sh's KEY=VALUE lines.
	Values map[string]string
	// Key and KnownHosts are the SSH material for the test user.
	Key, KnownHosts []byte
	root            string
}

// KVMHost is the host as a driver config entry named name.
func (h *Host) KVMHost(name string) kvm.Host {
	return kvm.Host{Name: name, Address: h.Values["SSH_ADDRESS"], User: h.Values["SSH_USER"], Socket: h.Values["SOCKET"],
		Pool: h.Values["POOL"], Network: h.Values["NETWORK"], DomainType: "qemu"}
}

// Credentials are the SSH credentials, host key verification on.
func (h *Host) Credentials() kvm.Credentials {
	return kvm.Credentials{Key: h.Key, KnownHosts: h.KnownHosts}
}

// Virsh runs virsh against the host's libvirtd and returns its output.
func (h *Host) Virsh(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := exec.Command("virsh", append([]string{"-c", "qemu:///system"}, args...)...).CombinedOutput()
	if err != nil {
		tb.Fatalf("virsh %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Volumes lists the pool's volume names.
func (h *Host) Volumes(tb testing.TB) []string {
	tb.Helper()
	var out []string
	for _, l := range strings.Split(h.Virsh(tb, "vol-list", "--pool", h.Values["POOL"]), "\n")[2:] {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}

// DeleteVolumes deletes those of names that are in the host's pool, and
// no other volume: a concurrent run's volumes are never touched.
func (h *Host) DeleteVolumes(tb testing.TB, names ...string) {
	tb.Helper()
	have := h.Volumes(tb)
	for _, v := range names {
		if slices.Contains(have, v) {
			h.Virsh(tb, "vol-delete", "--pool", h.Values["POOL"], v)
		}
	}
}

// Domains lists every domain's name, running or not.
func (h *Host) Domains(tb testing.TB) []string {
	tb.Helper()
	var out []string
	for _, l := range strings.Split(h.Virsh(tb, "list", "--all", "--name"), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

var (
	once    sync.Once
	host    *Host
	hostErr error
	upped   bool
)

// Up returns the real host, bringing it up on first use in this process.
// Call Down from TestMain after m.Run.
func Up(tb testing.TB) *Host {
	tb.Helper()
	once.Do(func() { host, hostErr = up() })
	if hostErr != nil {
		Unavailable(tb, "a real libvirt host", hostErr)
	}
	return host
}

// Unavailable fails tb under CI and skips it elsewhere.
func Unavailable(tb testing.TB, what string, err error) {
	tb.Helper()
	if testenv.CI() {
		tb.Fatalf("%s is required under CI and cannot be had: %v", what, err)
	}
	tb.Skipf("%s cannot be had here (set CI=true to make this a failure): %v", what, err)
}

// Start is Up for a program that is not a test (a benchmark under hack/):
// the host, or why it cannot be had. Call Down when done.
func Start() (*Host, error) {
	once.Do(func() { host, hostErr = up() })
	return host, hostErr
}

func up() (*Host, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("hack/libvirt-up.sh needs root (libvirtd, sshd, packages)")
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	cmd := exec.Command("bash", filepath.Join(root, "hack", "libvirt-up.sh"), strconv.Itoa(os.Getpid()))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		// It may have started daemons and changed the machine before it
		// failed, and registers its caller only at its end: down takes
		// back what it started unless another caller still uses it.
		down := exec.Command("bash", filepath.Join(root, "hack", "libvirt-down.sh"), strconv.Itoa(os.Getpid()))
		out, _ := down.CombinedOutput()
		return nil, fmt.Errorf("hack/libvirt-up.sh: %w\n%s\nhack/libvirt-down.sh after it:\n%s", err, stderr.String(), out)
	}
	upped = true
	fmt.Fprintf(os.Stderr, "kvmtest: libvirt host up in %.1fs\n%s", time.Since(start).Seconds(), stderr.String())
	h := &Host{Values: map[string]string{}, root: root}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			h.Values[k] = v
		}
	}
	if h.Key, err = os.ReadFile(h.Values["SSH_KEY"]); err != nil {
		return nil, err
	}
	if h.KnownHosts, err = os.ReadFile(h.Values["SSH_KNOWN_HOSTS"]); err != nil {
		return nil, err
	}
	return h, nil
}

// Down unregisters this process from the host; the last user's Down stops
// everything hack/libvirt-up.sh started.
func Down() {
	if !upped {
		return
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack", "libvirt-down.sh"), strconv.Itoa(os.Getpid()))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	_ = cmd.Run()
}

// GuestImage returns the path of the Debian guest image (squid,
// qemu-guest-agent, cloud-init), building it with hack/guest-image.sh on
// first use; the script caches it outside the repo, keyed by its content.
func GuestImage(tb testing.TB) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		Unavailable(tb, "the guest image", fmt.Errorf("hack/guest-image.sh needs root (mmdebstrap)"))
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack", "guest-image.sh"))
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr // a cold build takes minutes: show its progress
	if err := cmd.Run(); err != nil {
		Unavailable(tb, "the guest image", fmt.Errorf("hack/guest-image.sh: %w", err))
	}
	// The path is the last line: nothing else should be on stdout, but a
	// tool that talks there must not corrupt it.
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// GuestExec runs a shell script in the guest through its agent and returns
// what it printed (for diagnostics: cloud-init's and Squid's logs).
func (h *Host) GuestExec(tb testing.TB, domain, script string) string {
	tb.Helper()
	cmd := fmt.Sprintf(`{"execute":"guest-exec","arguments":{"path":"/bin/sh","arg":["-c",%q],"capture-output":true}}`, script)
	out, err := exec.Command("virsh", "-c", "qemu:///system", "qemu-agent-command", domain, cmd).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("guest-exec: %v: %s", err, out)
	}
	var started struct {
		Return struct {
			PID int `json:"pid"`
		} `json:"return"`
	}
	if err := json.Unmarshal(out, &started); err != nil {
		return fmt.Sprintf("guest-exec: %v: %s", err, out)
	}
	for range 50 {
		out, err := exec.Command("virsh", "-c", "qemu:///system", "qemu-agent-command", domain,
			fmt.Sprintf(`{"execute":"guest-exec-status","arguments":{"pid":%d}}`, started.Return.PID)).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("guest-exec-status: %v: %s", err, out)
		}
		var st struct {
			Return struct {
				Exited  bool   `json:"exited"`
				OutData string `json:"out-data"`
				ErrData string `json:"err-data"`
			} `json:"return"`
		}
		if err := json.Unmarshal(out, &st); err != nil {
			return fmt.Sprintf("guest-exec-status: %v: %s", err, out)
		}
		if st.Return.Exited {
			o, _ := base64.StdEncoding.DecodeString(st.Return.OutData)
			e, _ := base64.StdEncoding.DecodeString(st.Return.ErrData)
			return string(o) + string(e)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return "guest-exec: no answer"
}

// Purge removes a domain and its overlay and seed, for a test that failed
// before its own Delete.
func (h *Host) Purge(domain string) {
	for _, args := range [][]string{
		{"destroy", domain},
		{"undefine", "--nvram", domain},
		{"vol-delete", "--pool", h.Values["POOL"], domain + ".qcow2"},
		{"vol-delete", "--pool", h.Values["POOL"], domain + "-seed.iso"},
	} {
		_ = exec.Command("virsh", append([]string{"-c", "qemu:///system"}, args...)...).Run()
	}
}
