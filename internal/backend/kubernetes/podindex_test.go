package kubernetes

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// indexer records IndexField calls.
type indexer struct{ fields []string }

func (i *indexer) IndexField(_ context.Context, _ client.Object, field string, _ client.IndexerFunc) error {
	i.fields = append(i.fields, field)
	return nil
}

// TestAProxysPodsAreListedThroughTheIndex: once the cache indexes pods by
// their proxy's UID, a driver lists one proxy's pods through that index
// (the fake client refuses a field it has no index of), and finds exactly
// that proxy's pods, as without the index.
func TestAProxysPodsAreListedThroughTheIndex(t *testing.T) {
	pod := func(name, uid string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "proxies", Name: name, Labels: map[string]string{
			LabelManagedBy: ManagedBy, LabelName: "p-" + uid, LabelUID: uid, LabelInstallation: "inst",
		}}}
	}
	objs := []client.Object{pod("a-1", "a"), pod("b-1", "b"), pod("b-2", "b")}
	for _, indexed := range []bool{false, true} {
		b := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(objs...)
		if indexed {
			b = b.WithIndex(&corev1.Pod{}, podUIDIndex, proxyUID)
		}
		d := New(Options{Provider: "test", Config: Config{Namespace: "proxies"}, Client: b.Build()})
		d.podIndex = indexed
		pods, err := d.pods(context.Background(), "proxies", proxy.Mark{UID: "b", InstallationID: "inst"}, "p-b")
		if err != nil {
			t.Fatalf("indexed %v: %v", indexed, err)
		}
		if len(pods) != 2 || pods[0].Labels[LabelUID] != "b" || pods[1].Labels[LabelUID] != "b" {
			t.Errorf("indexed %v: listed %d pods, want b's two", indexed, len(pods))
		}
	}

	cl := &Cluster{}
	ix := &indexer{}
	for range 2 {
		if err := cl.IndexPods(context.Background(), ix); err != nil {
			t.Fatal(err)
		}
	}
	if len(ix.fields) != 1 || ix.fields[0] != podUIDIndex || !cl.Driver("test", Config{}, nil).podIndex {
		t.Errorf("IndexPods twice indexed %v, driver podIndex %v; want the index once, and drivers using it", ix.fields, cl.Driver("test", Config{}, nil).podIndex)
	}
}
