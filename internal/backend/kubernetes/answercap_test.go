package kubernetes

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// endless is an "API server" that answers every request with a
// Deployment whose name is size bytes of "SENTINEL", with or without a
// Content-Length, counting the bytes it got out.
func endless(t *testing.T, size int, withLength bool, sent *atomic.Int64) *httptest.Server {
	t.Helper()
	head, tail := `{"kind":"Deployment","apiVersion":"apps/v1","metadata":{"name":"`, `"}}`
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if withLength {
			w.Header().Set("Content-Length", strconv.Itoa(len(head)+size+len(tail)))
		}
		_, _ = w.Write([]byte(head))
		chunk := []byte(strings.Repeat("SENTINEL", 8<<10))
		for left := size; left > 0; left -= len(chunk) {
			n, err := w.Write(chunk[:min(left, len(chunk))])
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
		_, _ = w.Write([]byte(tail))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func tenantKubeconfig(server string) []byte {
	return []byte(fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: abc}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", server))
}

// TestTenantClusterAnswersAreCapped: a namespaced config's kubeconfig
// names an "API server" that answers with more than the provider reads
// of one answer. The call fails naming the cap and the server as the
// kubeconfig wrote it, quoting nothing it answered, and the provider
// stops reading there.
func TestTenantClusterAnswersAreCapped(t *testing.T) {
	const limit, size = 1 << 20, 16 << 20
	for name, withLength := range map[string]bool{"Streamed": false, "WithContentLength": true} {
		t.Run(name, func(t *testing.T) {
			var sent atomic.Int64
			srv := endless(t, size, withLength, &sent)
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			r := &Remote{Scheme: scheme, maxAnswer: limit}
			tenant := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
			cl, err := r.Cluster(tenantKubeconfig(srv.URL), tenant)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cl.Driver("ProviderConfig team-a/c", Config{Namespace: "proxies"}, nil).Get(context.Background(), proxy.Ref{Name: "p", Deleting: true, Live: true})
			want := "the answer of the kubeconfig's server " + srv.URL + " is larger than 1 MiB"
			if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "SENTINEL") {
				t.Errorf("Get = %.300v; want an error saying %q, quoting nothing the server sent", err, want)
			}
			if n := sent.Load(); n >= size {
				t.Errorf("the provider read %d MiB of answers; want it to stop past the cap", n>>20)
			}
		})
	}
}

// TestPodLogReadsAtMostLimitBytes: a server that ignores limitBytes is
// cut off where the kubelet would cut.
func TestPodLogReadsAtMostLimitBytes(t *testing.T) {
	var sent atomic.Int64
	srv := endless(t, 4<<20, false, &sent)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	r := &Remote{Scheme: scheme}
	cl, err := r.Cluster(tenantKubeconfig(srv.URL), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cl.PodLog(context.Background(), "proxies", "p-0", ReportContainerName, 5, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 4096 {
		t.Errorf("PodLog read %d bytes with limitBytes 4096; want 4096", len(b))
	}
}

// TestPlatformClusterAnswersAreReadWhole: the cap is for tenants' servers;
// a platform config's cluster is read whole, since a List of a big
// cluster's nodes (its networks) is one unpaginated answer.
func TestPlatformClusterAnswersAreReadWhole(t *testing.T) {
	const limit, size = 1 << 20, 2 << 20
	var sent atomic.Int64
	srv := endless(t, size, false, &sent)
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	r := &Remote{Scheme: scheme, maxAnswer: limit}
	cl, err := r.Cluster(tenantKubeconfig(srv.URL), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.Driver("ClusterProviderConfig c", Config{Namespace: "proxies"}, nil).Get(context.Background(), proxy.Ref{Name: "p", Deleting: true, Live: true})
	if err != nil && strings.Contains(err.Error(), "is larger than") {
		t.Errorf("Get = %.300v; want the platform's cluster read whole", err)
	}
	if n := sent.Load(); n < size {
		t.Errorf("the provider read %d of %d bytes", n, size)
	}
}
