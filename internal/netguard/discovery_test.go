package netguard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// countingClient is an API server's client holding objs that counts its
// reads in reads and fails them while fail is set.
func countingClient(t *testing.T, reads *atomic.Int32, fail *atomic.Bool, objs ...client.Object) client.Reader {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	read := func() error {
		reads.Add(1)
		if fail.Load() {
			return errors.New("connection reset by peer")
		}
		return nil
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := read(); err != nil {
				return err
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if err := read(); err != nil {
				return err
			}
			return c.List(ctx, l, opts...)
		},
	}).Build()
}

// A read that failed on the way is tried again after Retry, not after the
// TTL: until then the node's address would be missing from every check.
// A read that settled is reused for the TTL. The nodes' internal and
// external addresses are the cluster's, their host names are not read.
func TestDiscoveryRetriesAFailedRead(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec:       corev1.NodeSpec{PodCIDRs: []string{"10.250.0.0/24"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "192.168.7.4"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.9"},
			{Type: corev1.NodeHostName, Address: "n1"},
		}},
	}
	var reads atomic.Int32
	var fail atomic.Bool
	fail.Store(true)
	r := countingClient(t, &reads, &fail, node)
	d := &Discovery{Reader: r, TTL: time.Hour, Retry: 20 * time.Millisecond}
	ctx := context.Background()

	if got := d.Networks(ctx); len(got) != 0 {
		t.Errorf("Networks after a failed first read = %v; want none", got)
	}
	d.Networks(ctx)
	if n := reads.Load(); n != 4 {
		t.Errorf("two calls within Retry made %d reads; want 4 (one discovery)", n)
	}
	fail.Store(false)
	time.Sleep(30 * time.Millisecond)
	got := d.Networks(ctx)
	for _, want := range []string{"10.250.0.0/24", "192.168.7.4/32", "203.0.113.9/32"} {
		if !slices.Contains(got, netip.MustParsePrefix(want)) {
			t.Errorf("Networks after Retry = %v; want %s among them", got, want)
		}
	}
	if len(got) != 3 {
		t.Errorf("Networks = %v; want the pod range and the two addresses only", got)
	}
	time.Sleep(30 * time.Millisecond)
	d.Networks(ctx)
	if n := reads.Load(); n != 8 {
		t.Errorf("%d reads after a settled read and a call past Retry; want 8 (kept for the TTL)", n)
	}
}

// Cluster gives what the cluster says of its networks, from the same reads
// as Networks, without what the process sees of its host: the API server
// address it was given and, in a pod, its own interfaces' networks (all of
// the host's where it runs on the host's network).
func TestClusterLeavesOutTheProcesssOwnView(t *testing.T) {
	var reads atomic.Int32
	var fail atomic.Bool
	r := countingClient(t, &reads, &fail, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/12"}},
	})
	d := &Discovery{Reader: r, APIServer: "https://192.0.2.9:6443", InCluster: true}
	ctx := context.Background()
	all := d.Networks(ctx)
	if !slices.Contains(all, netip.MustParsePrefix("192.0.2.9/32")) || !slices.Contains(all, netip.MustParsePrefix("10.96.0.0/12")) {
		t.Errorf("Networks = %v; want the API server's address and the ServiceCIDR among them", all)
	}
	if got := d.Cluster().Networks(ctx); !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}) {
		t.Errorf("Cluster().Networks = %v; want only the ServiceCIDR", got)
	}
	if n := reads.Load(); n != 4 {
		t.Errorf("Networks and Cluster made %d reads; want 4 (one discovery)", n)
	}
}

// ReadCluster's lists are answered from the API server's watch cache
// (resourceVersion=0), each with its own selectors: the nodes are listed
// whole, not with the EndpointSlices' label selector. Checked on the
// requests the real REST client sends.
func TestReadClusterListsFromTheWatchCache(t *testing.T) {
	var mu sync.Mutex
	queries := map[string]url.Values{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries[r.URL.Path] = r.URL.Query()
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/services/kubernetes"):
			fmt.Fprint(w, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"kubernetes","namespace":"default"},"spec":{"clusterIPs":["10.96.0.1"]}}`)
		case strings.HasSuffix(r.URL.Path, "/endpointslices"):
			fmt.Fprint(w, `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSliceList","metadata":{},"items":[{"metadata":{"name":"kubernetes"},"addressType":"IPv4","endpoints":[{"addresses":["192.0.2.10"]}]}]}`)
		case strings.HasSuffix(r.URL.Path, "/servicecidrs"):
			fmt.Fprint(w, `{"apiVersion":"networking.k8s.io/v1","kind":"ServiceCIDRList","metadata":{},"items":[{"metadata":{"name":"kubernetes"},"spec":{"cidrs":["10.96.0.0/12"]}}]}`)
		case strings.HasSuffix(r.URL.Path, "/nodes"):
			fmt.Fprint(w, `{"apiVersion":"v1","kind":"NodeList","metadata":{},"items":[{"metadata":{"name":"n1"},"spec":{"podCIDRs":["10.250.0.0/24"]},"status":{"addresses":[{"type":"InternalIP","address":"192.168.7.4"}]}}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()

	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	mapper := apimeta.NewDefaultRESTMapper(nil)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Service"), apimeta.RESTScopeNamespace)
	mapper.Add(discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"), apimeta.RESTScopeNamespace)
	mapper.Add(networkingv1.SchemeGroupVersion.WithKind("ServiceCIDR"), apimeta.RESTScopeRoot)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Node"), apimeta.RESTScopeRoot)
	c, err := client.New(&rest.Config{Host: srv.URL}, client.Options{Scheme: s, Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}

	// Twice: a second read must not carry what the first wrote.
	for range 2 {
		for _, src := range ReadCluster(context.Background(), c) {
			if src.Err != nil || len(src.Prefixes) == 0 {
				t.Errorf("source %s: %v, %v; want its networks", src.Name, src.Prefixes, src.Err)
			}
		}
	}
	for path, want := range map[string]string{
		"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices": discoveryv1.LabelServiceName + "=kubernetes",
		"/apis/networking.k8s.io/v1/servicecidrs":                     "",
		"/api/v1/nodes": "",
	} {
		q, ok := queries[path]
		switch {
		case !ok:
			t.Errorf("no list of %s", path)
		case q.Get("resourceVersion") != "0":
			t.Errorf("list of %s: resourceVersion %q; want 0 (the watch cache)", path, q.Get("resourceVersion"))
		case q.Get("labelSelector") != want:
			t.Errorf("list of %s: labelSelector %q; want %q", path, q.Get("labelSelector"), want)
		}
	}
}

// Cluster's networks are complete once every source has answered (or was
// refused for good) once, and stay so while later reads fail on the way;
// until then they are an UnknownError naming the sources, quoting none
// of their errors.
func TestClusterIsCompleteOnceEverySourceAnswered(t *testing.T) {
	var reads atomic.Int32
	var fail atomic.Bool
	fail.Store(true)
	r := countingClient(t, &reads, &fail, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/12"}},
	})
	d := &Discovery{Reader: r, TTL: time.Millisecond, Retry: time.Millisecond}
	c, ok := d.Cluster().(Complete)
	if !ok {
		t.Fatal("Cluster() does not say whether it is complete")
	}
	ctx := context.Background()
	var unknown *UnknownError
	if _, err := c.Complete(ctx); !errors.As(err, &unknown) || len(unknown.Sources) != 4 || strings.Contains(err.Error(), "reset") {
		t.Errorf("Complete before any answer = %v; want an UnknownError naming the four sources", err)
	}
	fail.Store(false)
	time.Sleep(2 * time.Millisecond)
	if got, err := c.Complete(ctx); err != nil || !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}) {
		t.Errorf("Complete once answered = %v, %v; want the ServiceCIDR", got, err)
	}
	fail.Store(true)
	time.Sleep(2 * time.Millisecond)
	if got, err := c.Complete(ctx); err != nil || len(got) != 1 {
		t.Errorf("Complete when a later read fails = %v, %v; want what was read before", got, err)
	}
}

// Until the cluster's networks have answered once, the guard cannot tell
// a node's address from any other: it refuses nothing for good and lets
// nothing through, saying so without the address; once they answered, a
// node's address is refused.
func TestGuardWaitsForTheClustersNetworks(t *testing.T) {
	var reads atomic.Int32
	var fail atomic.Bool
	fail.Store(true)
	r := countingClient(t, &reads, &fail, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "203.0.113.9"}}},
	})
	g := New(Options{Cluster: &Discovery{Reader: r, Retry: time.Millisecond}})
	ctx := context.Background()
	node := netip.MustParseAddr("203.0.113.9")
	for name, err := range map[string]error{"Check": g.Check(ctx, node), "CheckURL": g.CheckURL(ctx, &url.URL{Scheme: "https", Host: "203.0.113.9"})} {
		if !proxy.IsTransient(err) || IsRefused(err) || strings.Contains(err.Error(), "203.0.113") || strings.Contains(err.Error(), "reset") {
			t.Errorf("%s before the cluster answered = %v; want a Transient error naming neither the address nor the read's error", name, err)
		}
	}
	fail.Store(false)
	time.Sleep(2 * time.Millisecond)
	if err := g.Check(ctx, node); !IsRefused(err) {
		t.Errorf("Check of a node's address once the cluster answered = %v; want a refusal", err)
	}
	if err := g.Check(ctx, netip.MustParseAddr("198.51.100.7")); err != nil {
		t.Errorf("Check of another public address = %v; want nil", err)
	}
}
