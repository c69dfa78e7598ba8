package kubernetes

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// A resource being deleted confirms a cache miss of its Deployment with a
// live read, unless the watch saw the Deployment deleted and the driver
// has not created it since.
func TestMissOfADeploymentTheWatchSawDeletedIsTrusted(t *testing.T) {
	d, live := goneDriver(t)
	ref := proxy.Ref{Name: "p-1", Live: true, Deleting: true}
	get := func() {
		t.Helper()
		if _, err := d.deployment(context.Background(), ref); !proxy.IsNotFound(err) {
			t.Fatalf("deployment() = %v, want NotFound", err)
		}
	}

	get()
	if n := live.reads.Load(); n != 1 {
		t.Fatalf("a miss with nothing seen made %d live reads, want 1", n)
	}
	h := d.gone.handler()
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: "p-1"}}
	h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "egress/p-1", Obj: dep})
	get()
	if n := live.reads.Load(); n != 1 {
		t.Errorf("a miss of a Deployment the watch saw deleted made %d live reads, want none more", n-1)
	}
	d.gone.forget(types.NamespacedName{Namespace: "egress", Name: "p-1"}, true)
	get()
	if n := live.reads.Load(); n != 2 {
		t.Errorf("a miss after the driver created the name again made %d live reads, want 1", n-1)
	}
	h.OnDelete(dep)
	h.OnAdd(dep, false)
	get()
	if n := live.reads.Load(); n != 3 {
		t.Errorf("a miss after the watch saw the name created again made %d live reads, want 1", n-2)
	}
}

// A live resource trusts a cache miss of its Deployment (Create adopts
// one that exists), except right after a driver created it, until the
// watch delivers it: then the miss is confirmed with a live read, so a
// reconcile right after Create does not create it again.
func TestMissOfADeploymentBeingCreatedIsConfirmed(t *testing.T) {
	d, live := goneDriver(t)
	ref := proxy.Ref{Name: "p-1"}
	key := types.NamespacedName{Namespace: "egress", Name: "p-1"}
	reads := []struct {
		what string
		do   func()
		want int32
	}{
		{"a miss of a name no driver is creating", func() {}, 0},
		{"a miss of a Deployment being created", func() { d.gone.forget(key, true) }, 1},
		{"a miss once the watch delivered it", func() {
			d.gone.handler().OnAdd(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: "p-1"}}, false)
		}, 1},
	}
	for _, r := range reads {
		r.do()
		if _, err := d.deployment(context.Background(), ref); !proxy.IsNotFound(err) {
			t.Fatalf("%s: deployment() = %v, want NotFound", r.what, err)
		}
		if n := live.reads.Load(); n != r.want {
			t.Errorf("%s: %d live reads in all, want %d", r.what, n, r.want)
		}
	}
}

// Once a driver's create of a Deployment is answered, a reconcile before
// the watch delivers it reads the answer: no live read, the Deployment as
// created. The watch's delivery or deletion of it ends that.
func TestAnsweredCreateStandsInForTheCache(t *testing.T) {
	d, live := goneDriver(t)
	key := types.NamespacedName{Namespace: "egress", Name: "p-1"}
	made := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: "p-1", UID: "dep-uid", ResourceVersion: "7",
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}}}

	// Answered without being created (a stale answer of an earlier
	// create): kept for nothing.
	d.gone.answered(key, made)
	if d.gone.asAnswered(key) != nil {
		t.Fatal("an answer kept for a name no driver is creating")
	}

	d.gone.forget(key, true)
	d.gone.answered(key, made)
	for _, ref := range []proxy.Ref{{Name: "p-1"}, {Name: "p-1", Live: true, Deleting: true}} {
		got, err := d.deployment(context.Background(), ref)
		if err != nil {
			t.Fatalf("deployment(%+v) = %v, want the Deployment as created", ref, err)
		}
		if got.UID != "dep-uid" || got.ResourceVersion != "7" || got.ManagedFields != nil {
			t.Errorf("deployment(%+v) = uid %q rv %q managedFields %v; want the answer, stripped", ref, got.UID, got.ResourceVersion, got.ManagedFields)
		}
		got.Labels = map[string]string{"changed": "by the caller"}
	}
	if n := live.reads.Load(); n != 0 {
		t.Errorf("%d live reads while the answer stands in, want none", n)
	}
	if a := d.gone.asAnswered(key); a == nil || a.Labels != nil {
		t.Errorf("the kept answer = %v; want it unchanged by what a caller did to its copy", a)
	}

	d.gone.handler().OnAdd(made, false)
	if d.gone.asAnswered(key) != nil {
		t.Error("the answer still stands in once the watch delivered the Deployment")
	}
	d.gone.forget(key, true)
	d.gone.answered(key, made)
	d.gone.handler().OnDelete(made)
	if _, err := d.deployment(context.Background(), proxy.Ref{Name: "p-1"}); !proxy.IsNotFound(err) {
		t.Errorf("after the watch saw it deleted, deployment() = %v; want NotFound", err)
	}
}

// goneDriver is a driver in namespace egress on an empty cache, with a
// gone of its own and live reads counted.
func goneDriver(t *testing.T) (*Driver, *countingReader) {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	live := &countingReader{Reader: fake.NewClientBuilder().WithScheme(s).Build()}
	d := New(Options{Provider: "t", Client: fake.NewClientBuilder().WithScheme(s).Build(), Live: live, Config: Config{Namespace: "egress"}})
	d.gone = newGone()
	return d, live
}
