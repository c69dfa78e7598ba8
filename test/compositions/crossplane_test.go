package compositions_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
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
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/function"
	xpt "github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane/crossplanetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/pki"
)

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

	xpt.StartProcess(t, "crossplane core", filepath.Join(dir, "crossplane.log"), env, filepath.Join(bins, "crossplane"),
		"core", "start", "--enable-webhooks=false", "--package-runtime=External",
		"--tls-client-certs-dir="+certs, "--xpkg-cache-dir="+filepath.Join(dir, "xpkg-cache"),
		"--metrics-port=0", "--health-probe-port=0",
	)
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
