package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// calls records the requests a driver sends, as "verb Kind".
type calls struct {
	mu  sync.Mutex
	got []string
	// collectionErr, when set, answers every deletecollection.
	collectionErr error
}

func (c *calls) add(verb string, obj client.Object) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, verb+" "+kindOf(obj))
}

// sorted are the calls so far in a stable order (the children's are sent
// in parallel), and forgets them.
func (c *calls) sorted() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	got := slices.Clone(c.got)
	c.got = nil
	slices.Sort(got)
	return got
}

// countingDriver is a driver over a fake API server holding objs, with
// the calls it makes of the server.
func countingDriver(t *testing.T, objs ...client.Object) (*Driver, client.Client, *calls) {
	t.Helper()
	c := &calls{}
	fc := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			// Reads of the proxy's objects only (not the cluster's own
			// networks, read once per cluster).
			if key.Namespace == "egress" {
				c.add("get", obj)
			}
			return cl.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			c.add("create", obj)
			// As the API server does (the fake leaves it unset): Create
			// then views a Deployment made just now.
			obj.SetCreationTimestamp(metav1.Now())
			return cl.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			c.add("update", obj)
			return cl.Update(ctx, obj, opts...)
		},
		Delete: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			c.add("delete", obj)
			return cl.Delete(ctx, obj, opts...)
		},
		DeleteAllOf: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteAllOfOption) error {
			c.add("deletecollection", obj)
			if c.collectionErr != nil {
				return c.collectionErr
			}
			return cl.DeleteAllOf(ctx, obj, opts...)
		},
	}).Build()
	d := New(Options{Provider: "ClusterProviderConfig pods", Config: Config{Namespace: "egress", NetworkPolicy: true}, Client: fc, Live: fc})
	d.taken = &taken{}
	return d, fc, c
}

// A new proxy's children are created without reading their names first:
// one request each.
func TestFreshCreateReadsNoName(t *testing.T) {
	d, _, c := countingDriver(t)
	if _, err := d.Create(context.Background(), testRequest()); err != nil {
		t.Fatal(err)
	}
	want := []string{"create Deployment", "create NetworkPolicy", "create Secret"}
	if diff := cmp.Diff(want, c.sorted()); diff != "" {
		t.Errorf("requests of a fresh Create (-want +got):\n%s", diff)
	}
}

// A child's name taken by someone else's object refuses the Create, which
// leaves nothing of the proxy and that object as it was; the next attempt
// reads the names before creating anything.
func TestCreateOverATakenNameLeavesNothing(t *testing.T) {
	req := testRequest()
	for _, victim := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: req.Name}, Data: map[string][]byte{"api-key": []byte("S3NT1NEL")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: req.Name, Labels: markLabels(proxy.Request{Name: req.Name, Mark: proxy.Mark{UID: "another-uid", InstallationID: "prod-eu"}})}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: req.Name}},
	} {
		t.Run(fmt.Sprintf("%s %v", kindOf(victim), victim.GetLabels()[LabelUID]), func(t *testing.T) {
			ctx := context.Background()
			d, fc, c := countingDriver(t, copyOf(t, victim))
			r := req
			if _, ok := victim.(*corev1.Service); ok {
				r.Extension = Exposure{ServiceType: "ClusterIP"}
			}
			before := copyOf(t, victim)
			if err := fc.Get(ctx, client.ObjectKeyFromObject(victim), before); err != nil {
				t.Fatal(err)
			}
			_, err := d.Create(ctx, r)
			if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), kindOf(victim)+" egress/"+req.Name) || strings.Contains(err.Error(), "S3NT1NEL") {
				t.Fatalf("Create over a taken name = %v; want Permanent naming the %s, without its data", err, kindOf(victim))
			}
			key := types.NamespacedName{Namespace: "egress", Name: req.Name}
			if err := fc.Get(ctx, key, &appsv1.Deployment{}); !kerrors.IsNotFound(err) {
				t.Errorf("the refused Create left its Deployment (get: %v)", err)
			}
			after := copyOf(t, victim)
			if err := fc.Get(ctx, key, after); err != nil || after.GetResourceVersion() != before.GetResourceVersion() || len(after.GetOwnerReferences()) != 0 {
				t.Errorf("the %s changed: %v, resourceVersion %s -> %s, owners %v", kindOf(victim), err, before.GetResourceVersion(), after.GetResourceVersion(), after.GetOwnerReferences())
			}
			c.sorted()
			// Retried: the names are read first, nothing is created.
			if _, err := d.Create(ctx, r); !proxy.IsPermanent(err) {
				t.Fatalf("the retried Create = %v; want Permanent", err)
			}
			for _, call := range c.sorted() {
				if !strings.HasPrefix(call, "get ") {
					t.Errorf("the retried Create of a refused name sent %q; want only reads", call)
				}
			}
		})
	}
}

// copyOf is a deep copy of o.
func copyOf(t *testing.T, o client.Object) client.Object {
	t.Helper()
	c, ok := o.DeepCopyObject().(client.Object)
	if !ok {
		t.Fatalf("a copy of %T is not an object", o)
	}
	return c
}

// A child of this resource's left from an earlier attempt (no controller,
// its mark) is taken over: the Create succeeds and the next one of the
// name reads nothing first.
func TestCreateTakesOverItsOwnLeftoverChild(t *testing.T) {
	req := testRequest()
	leftover := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: req.Name, Labels: markLabels(req)}, Data: map[string][]byte{KeySquidConf: []byte("old")}}
	d, fc, c := countingDriver(t, leftover)
	if _, err := d.Create(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	want := []string{"create Deployment", "create NetworkPolicy", "create Secret", "get Secret", "update Secret"}
	if diff := cmp.Diff(want, c.sorted()); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	s := &corev1.Secret{}
	if err := fc.Get(context.Background(), client.ObjectKeyFromObject(leftover), s); err != nil {
		t.Fatal(err)
	}
	if string(s.Data[KeySquidConf]) == "old" || s.Data[OwnerKey(req.Mark.UID)] == nil || len(s.OwnerReferences) != 1 {
		t.Errorf("the leftover Secret was not rewritten as the proxy's: %v keys, owners %v", len(s.Data), s.OwnerReferences)
	}
	if d.taken.has(client.ObjectKeyFromObject(leftover)) {
		t.Errorf("a Create that succeeded left its name among the refused")
	}
}
