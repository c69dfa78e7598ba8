// Package testenv starts what the integration tests share: a real control
// plane (internal/devenv/controlplane) with the provider's CRDs installed, and a
// scheme that knows Kubernetes' kinds and the provider's.
package testenv

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/egressproxy/provider-egressproxy/apis"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
)

// Start starts a control plane for t (stopped when t ends) with o, plus
// the provider's CRDs from package/crds, and returns it with the scheme.
func Start(t testing.TB, o controlplane.Options) (*controlplane.ControlPlane, *runtime.Scheme) {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	o.CRDDirectories = append([]string{filepath.Join(root, "package", "crds")}, o.CRDDirectories...)
	cp := controlplane.ForTest(t, o)
	return cp, Scheme(t)
}

// Scheme knows Kubernetes' kinds and the provider's.
func Scheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := apis.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// WaitFor polls cond until it holds, or fails t after timeout with what
// cond saw last. It polls often for short waits and at most every second
// for long ones.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() (ok bool, seen string)) {
	t.Helper()
	every := min(max(timeout/200, 50*time.Millisecond), time.Second)
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, seen := cond()
		if ok {
			return
		}
		last = seen
		time.Sleep(every)
	}
	t.Fatalf("timed out after %v waiting for %s; last seen: %s", timeout, what, last)
}

// Buffer is a strings.Builder for concurrent writers (a process's output
// and the test reading it).
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// Line writes l and a newline.
func (b *Buffer) Line(l string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.WriteString(l)
	b.b.WriteByte('\n')
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// SquidImage is the Squid image of hack/squid-image.sh (built once, then
// cached): its tarball and name, and those of its crashing variant (a
// squid that prints squidimage.CrashMessage and exits 1). It fails t when
// the image cannot be built.
type SquidImage struct {
	Tarball, Ref                 string
	CrashingTarball, CrashingRef string
}

// BuildSquidImage runs hack/squid-image.sh (minutes cold, instant when
// cached) and fails t if it fails.
func BuildSquidImage(t testing.TB) SquidImage {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var stderr Buffer
	cmd := exec.Command("bash", filepath.Join(root, "hack", "squid-image.sh"))
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/squid-image.sh: %v\n%s", err, stderr.String())
	}
	f := strings.Fields(string(out))
	if len(f) != 4 {
		t.Fatalf("hack/squid-image.sh printed %q; want four lines\n%s", out, stderr.String())
	}
	return SquidImage{Tarball: f[0], Ref: f[1], CrashingTarball: f[2], CrashingRef: f[3]}
}

// FreePort returns a TCP port no process listens on, on any address, at
// the time of the call: for a test that must pick a port number a proxy
// or a process it starts will listen on (a fixed one, such as 8080, can
// be taken by another test's process listening on every address).
func FreePort(t testing.TB) int32 {
	t.Helper()
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return int32(l.Addr().(*net.TCPAddr).Port) //nolint:forcetypeassert,gosec // A TCP listener's port fits.
}

// Main is the TestMain of an integration test package: the test binary
// serves as the Go client of FetchWithEnv when started as one, else it
// runs the tests, then after (the teardown of what the package's tests
// share, such as kvmtest.Down), and exits with the tests' status.
// controller-runtime's logger is set to discard (a test that runs the
// provider sets its own), so a package that only uses its client does
// not print the "log.SetLogger(...) was never called" stack.
func Main(m *testing.M, after ...func()) {
	ServeFetch()
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	for _, f := range after {
		f()
	}
	os.Exit(code)
}
