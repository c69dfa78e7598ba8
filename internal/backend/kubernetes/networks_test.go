package kubernetes

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// countingReader counts reads and can fail them.
type countingReader struct {
	client.Reader
	reads atomic.Int32
	fail  atomic.Bool
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.reads.Add(1)
	if c.fail.Load() {
		return errors.New("connection reset by peer")
	}
	return c.Reader.Get(ctx, key, obj, opts...)
}

func (c *countingReader) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	c.reads.Add(1)
	if c.fail.Load() {
		return errors.New("connection reset by peer")
	}
	return c.Reader.List(ctx, l, opts...)
}

// The cluster's networks are read once per networksTTL, not twice per
// Create; a read that failed on the way is not kept.
func TestClusterNetworksAreReused(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"}, Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.1"}}},
		&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/12"}}},
	).Build()
	ctx := context.Background()

	failing := &countingReader{Reader: c}
	failing.fail.Store(true)
	d := New(Options{Provider: "t", Client: c, Live: failing, Host: "https://flaky.example:6443"})
	d.clusterNetworks(ctx)
	d.clusterNetworks(ctx)
	if n := failing.reads.Load(); n != 6 {
		t.Errorf("after failed reads: %d reads for two calls, want 6 (nothing kept)", n)
	}

	live := &countingReader{Reader: c}
	d = New(Options{Provider: "t", Client: c, Live: live, Host: "https://api.example:6443", Config: Config{ClusterNetworks: []string{"192.0.2.0/24"}}})
	want := []string{"10.96.0.0/12", "10.96.0.1/32", "192.0.2.0/24"}
	for range 5 {
		got := d.clusterNetworks(ctx)
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Fatalf("clusterNetworks = %v, want %v", got, want)
		}
	}
	if n := live.reads.Load(); n != 3 {
		t.Errorf("five calls made %d reads, want 3 (one discovery)", n)
	}
}

// Creates that start together wait for one read of the cluster's networks
// instead of each sending their own, and all get what it read.
func TestClusterNetworksAreReadOnceByConcurrentCreates(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/12"}}},
	).Build()
	live := &countingReader{Reader: c}
	d := New(Options{Provider: "t", Client: c, Live: live, Host: "https://together.example:6443"})
	var wg sync.WaitGroup
	got := make([][]string, 50)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = d.clusterNetworks(context.Background())
		}()
	}
	wg.Wait()
	for i, g := range got {
		if len(g) != 1 || g[0] != "10.96.0.0/12" {
			t.Fatalf("call %d: clusterNetworks = %v, want [10.96.0.0/12]", i, g)
		}
	}
	if n := live.reads.Load(); n != 3 {
		t.Errorf("50 concurrent calls made %d reads, want 3 (one discovery)", n)
	}
}
