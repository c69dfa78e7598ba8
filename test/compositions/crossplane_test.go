package compositions_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/crossplane/function-sdk-go/logging"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/function"
	"github.com/egressproxy/provider-egressproxy/internal/pki"
)

// EnvCrossplaneBin names a folder holding crossplane (core v2.4.0) and
// crds/ (its CRDs), replacing hack/crossplane-bins.sh.
const EnvCrossplaneBin = "EGRESSPROXY_CROSSPLANE_BIN"

// crossplaneBins returns the folder printed by hack/crossplane-bins.sh,
// which builds Crossplane core from the Go module proxy only when it is
// missing. It fails t, never skips it.
func crossplaneBins(t testing.TB, root string) string {
	t.Helper()
	if d := os.Getenv(EnvCrossplaneBin); d != "" {
		return d
	}
	var out, errb bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(root, "hack", "crossplane-bins.sh"))
	cmd.Dir = root
	cmd.Stdout = &out
	cmd.Stderr = io.MultiWriter(&errb, os.Stderr) // a cold build takes minutes: show it
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/crossplane-bins.sh (builds Crossplane core %s from the Go module proxy): %v\n%s", "v2.4.0", err, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	dir := lines[len(lines)-1]
	for _, f := range []string{"crossplane", "crds"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("hack/crossplane-bins.sh printed %s, which has no %s: %v", dir, f, err)
		}
	}
	return dir
}

// process is a child process whose output goes to a file, shown when the
// test fails.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
}

func startProcess(t testing.TB, name, logPath string, env []string, bin string, args ...string) *process {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group, and killed with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = f.Close(); close(p.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s: last lines of its log:\n%s", name, tailFile(logPath, 60))
		}
	})
	return p
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// crossplane is Crossplane core running out of cluster on the control
// plane, as LOCAL-CONTROL-PLANE.md describes: `core init` (CRDs, the CA and
// the client certificate), then `core start` with webhooks off and the
// External package runtime (nothing is deployed; functions are reached at
// the endpoint their revision's status names).
type crossplane struct {
	ca *pki.CA
}

func startCrossplane(t testing.TB, kube client.Client, bins, kubeconfig, dir string) *crossplane {
	t.Helper()
	env := []string{
		"KUBECONFIG=" + kubeconfig,
		"CRDS_PATH=" + filepath.Join(bins, "crds"),
		"TLS_CA_SECRET_NAME=crossplane-root-ca",
		"TLS_CLIENT_SECRET_NAME=crossplane-tls-client",
		"POD_NAMESPACE=crossplane-system",
	}
	init := exec.Command(filepath.Join(bins, "crossplane"), "core", "init", "--enable-webhooks=false")
	init.Env = append(os.Environ(), env...)
	if out, err := init.CombinedOutput(); err != nil {
		t.Fatalf("crossplane core init: %v\n%s", err, out)
	}

	// core start reads its client certificate from a folder, as it would
	// from the mounted Secret in a cluster.
	ctx := context.Background()
	client := &corev1.Secret{}
	if err := kube.Get(ctx, types.NamespacedName{Namespace: "crossplane-system", Name: "crossplane-tls-client"}, client); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(dir, "tls-client")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if len(client.Data[k]) == 0 {
			t.Fatalf("crossplane core init left no %s in Secret crossplane-system/crossplane-tls-client", k)
		}
		if err := os.WriteFile(filepath.Join(certs, k), client.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ca := &corev1.Secret{}
	if err := kube.Get(ctx, types.NamespacedName{Namespace: "crossplane-system", Name: "crossplane-root-ca"}, ca); err != nil {
		t.Fatal(err)
	}
	xp := &crossplane{}
	var err error
	if xp.ca, err = pki.LoadCA(ca.Data["tls.crt"], ca.Data["tls.key"]); err != nil {
		t.Fatalf("Secret crossplane-system/crossplane-root-ca: %v", err)
	}

	p := startProcess(t, "crossplane core", filepath.Join(dir, "crossplane.log"), env, filepath.Join(bins, "crossplane"),
		"core", "start", "--enable-webhooks=false", "--package-runtime=External",
		"--tls-client-certs-dir="+certs, "--xpkg-cache-dir="+filepath.Join(dir, "xpkg-cache"),
		"--metrics-port=0", "--health-probe-port=0",
	)
	_ = p
	return xp
}

// serveFunction runs the composition function in this process on a
// loopback port, with a server certificate for localhost signed by
// Crossplane's CA and requiring Crossplane's client certificate, and
// registers it as Crossplane would find an installed function: a Function
// and an active FunctionRevision, paused (so the package manager leaves
// them alone), whose status names the endpoint.
func (xp *crossplane) serveFunction(t testing.TB, kube client.Client, name string) {
	t.Helper()
	leaf, err := xp.ca.Issue(pki.Leaf{Subject: pkix.Name{CommonName: name}, DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(xp.ca.CertPEM)
	creds := credentials.NewTLS(&tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{leaf.TLS},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	calls := &callCounter{FunctionRunnerServiceServer: function.New(logging.NewNopLogger())}
	srv := grpc.NewServer(grpc.Creds(creds))
	fnv1.RegisterFunctionRunnerServiceServer(srv, calls)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Stop()
		t.Logf("function: %d RunFunction calls", calls.n())
	})
	port := l.Addr().(*net.TCPAddr).Port //nolint:forcetypeassert // a TCP listener.

	ctx := context.Background()
	paused := map[string]any{"crossplane.io/paused": "true"}
	fn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "pkg.crossplane.io/v1", "kind": "Function",
		"metadata": map[string]any{"name": name, "annotations": paused},
		"spec":     map[string]any{"package": "registry.test.example/egressproxy/function-egressproxy:v0.1.0"},
	}}
	if err := kube.Create(ctx, fn); err != nil {
		t.Fatal(err)
	}
	rev := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "pkg.crossplane.io/v1", "kind": "FunctionRevision",
		"metadata": map[string]any{
			"name": name + "-local", "annotations": paused,
			"labels": map[string]any{"pkg.crossplane.io/package": name},
			"ownerReferences": []any{map[string]any{
				"apiVersion": "pkg.crossplane.io/v1", "kind": "Function", "name": name, "uid": string(fn.GetUID()),
				"controller": true,
			}},
		},
		"spec": map[string]any{
			"desiredState": "Active", "image": "registry.test.example/egressproxy/function-egressproxy:v0.1.0", "revision": int64(1),
		},
	}}
	if err := kube.Create(ctx, rev); err != nil {
		t.Fatal(err)
	}
	rev.Object["status"] = map[string]any{
		"endpoint":     fmt.Sprintf("dns:///localhost:%d", port),
		"capabilities": []any{"composition"},
		"conditions": []any{map[string]any{
			"type": "Healthy", "status": "True", "reason": "HealthyPackageRevision",
			"lastTransitionTime": metav1.Now().UTC().Format(time.RFC3339),
		}},
	}
	if err := kube.Status().Update(ctx, rev); err != nil {
		t.Fatal(err)
	}
}

// callCounter counts the calls Crossplane makes to the function.
type callCounter struct {
	fnv1.FunctionRunnerServiceServer
	mu    sync.Mutex
	count int
}

func (c *callCounter) RunFunction(ctx context.Context, req *fnv1.RunFunctionRequest) (*fnv1.RunFunctionResponse, error) {
	c.mu.Lock()
	c.count++
	c.mu.Unlock()
	return c.FunctionRunnerServiceServer.RunFunction(ctx, req)
}

func (c *callCounter) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count
}

// applyFile creates every object of a YAML file.
func applyFile(t testing.TB, kube client.Client, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := d.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := kube.Create(context.Background(), u); err != nil {
			t.Fatalf("%s: creating %s %s: %v", path, u.GetKind(), u.GetName(), err)
		}
		out = append(out, u)
	}
}
