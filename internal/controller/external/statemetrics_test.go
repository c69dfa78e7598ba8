package external

import (
	"context"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/statemetrics"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
)

// The state metrics count the kind's resources in the informer's store,
// and those Ready and Synced, under the label the runtime's recorder uses.
func TestStateRecorderCountsTheCachedResources(t *testing.T) {
	s := runtime.NewScheme()
	if err := nsproxy.SchemeBuilder.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	gvk := nsproxy.KVMProxyGroupVersionKind
	inf := toolscache.NewSharedIndexInformer(&toolscache.ListWatch{}, &nsproxy.KVMProxy{}, 0, toolscache.Indexers{})
	for i, conds := range [][]xpv2.Condition{
		{xpv2.Available(), xpv2.ReconcileSuccess()},
		{xpv2.Creating(), xpv2.ReconcileSuccess()},
		{xpv2.Available(), xpv2.ReconcileError(context.Canceled)},
		nil,
	} {
		p := &nsproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: string(rune('a' + i))}}
		p.SetConditions(conds...)
		if err := inf.GetStore().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	fi := &informertest.FakeInformers{Scheme: s, InformersByGVK: map[schema.GroupVersionKind]toolscache.SharedIndexInformer{gvk: inf}}
	m := statemetrics.NewMRStateMetrics()
	r := newStateRecorder(fi, &nsproxy.KVMProxy{}, gvk, m, 0)
	if err := r.Record(context.Background()); err != nil {
		t.Fatal(err)
	}
	label := "proxy.m.egressproxy.io/v1alpha1, Kind=KVMProxy"
	for name, tc := range map[string]struct {
		got  float64
		want float64
	}{
		"exists": {testutil.ToFloat64(m.Exists.WithLabelValues(label)), 4},
		"ready":  {testutil.ToFloat64(m.Ready.WithLabelValues(label)), 2},
		"synced": {testutil.ToFloat64(m.Synced.WithLabelValues(label)), 2},
	} {
		if tc.got != tc.want {
			t.Errorf("managed_resource_%s{gvk=%q} = %v, want %v", name, label, tc.got, tc.want)
		}
	}
}
