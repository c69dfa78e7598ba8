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
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
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

// A LoadBalancer Service has addresses of its clients' families only:
// kube-proxy applies to an address only the source ranges of its family,
// and a family without ranges admits every source. Clients of one family
// ask for it alone (an IPv4 default would admit every IPv4 source to a
// proxy of IPv6 clients); clients of both leave the family to the
// cluster, single-stack or dual. A Service of another first family is
// made again; a cluster that refuses the family gets a condition saying
// why.
func TestLoadBalancerServesTheClientsFamiliesOnly(t *testing.T) {
	ctx := context.Background()
	var invalid bool
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	fc := fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Service); ok && invalid {
				return kerrors.NewInvalid(schema.GroupKind{Kind: "Service"}, obj.GetName(), field.ErrorList{field.Invalid(field.NewPath("spec", "ipFamilies").Index(0), "IPv6", "not configured on this cluster")})
			}
			return cl.Create(ctx, obj, opts...)
		},
	}).Build()
	d := New(Options{Provider: "t", Config: Config{Namespace: "egress"}, Client: fc, Live: fc})
	d.taken = &taken{}
	req := testRequest()
	req.Extension = Exposure{ServiceType: "LoadBalancer"}
	svc := func() *corev1.Service {
		t.Helper()
		s := &corev1.Service{}
		if err := fc.Get(ctx, types.NamespacedName{Namespace: "egress", Name: req.Name}, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	inst, err := d.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}
	if s := svc(); !slices.Equal(s.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol}) || ptr.Deref(s.Spec.IPFamilyPolicy, "") != corev1.IPFamilyPolicySingleStack {
		t.Errorf("Service of IPv4 clients: ipFamilies %v, policy %v; want [IPv4] SingleStack", s.Spec.IPFamilies, ptr.Deref(s.Spec.IPFamilyPolicy, ""))
	}

	req.Proxy.AllowedClientCIDRs = []string{"10.0.0.0/8", "2001:db8:1234::/48"}
	if _, err := d.Update(ctx, ref, req); err != nil {
		t.Fatal(err)
	}
	if s := svc(); !slices.Equal(s.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol}) || ptr.Deref(s.Spec.IPFamilyPolicy, "") != corev1.IPFamilyPolicyPreferDualStack {
		t.Errorf("Service of clients of both families: ipFamilies %v, policy %v; want the cluster's, PreferDualStack", s.Spec.IPFamilies, ptr.Deref(s.Spec.IPFamilyPolicy, ""))
	}

	// IPv6 clients only: the IPv4 Service goes, and comes back in IPv6.
	req.Proxy.AllowedClientCIDRs = []string{"2001:db8:1234::/48"}
	_, err = d.Update(ctx, ref, req)
	if !proxy.IsTransient(err) || !strings.Contains(err.Error(), "serves IPv4 first") || !strings.Contains(err.Error(), "made again in IPv6") {
		t.Errorf("Update to IPv6 clients of an IPv4 Service = %v; want Transient, saying it is made again", err)
	}
	if err := fc.Get(ctx, types.NamespacedName{Namespace: "egress", Name: req.Name}, &corev1.Service{}); !kerrors.IsNotFound(err) {
		t.Errorf("the IPv4 Service of IPv6 clients: %v; want it deleted", err)
	}
	if _, err := d.Update(ctx, ref, req); err != nil {
		t.Fatal(err)
	}
	if s := svc(); !slices.Equal(s.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv6Protocol}) || !slices.Equal(s.Spec.LoadBalancerSourceRanges, []string{"2001:db8:1234::/48"}) {
		t.Errorf("Service of IPv6 clients: ipFamilies %v, ranges %v; want [IPv6], the clients' range", s.Spec.IPFamilies, s.Spec.LoadBalancerSourceRanges)
	}

	// A cluster without IPv6 Services refuses it: a condition says why.
	if err := fc.Delete(ctx, svc()); err != nil {
		t.Fatal(err)
	}
	invalid = true
	_, err = d.Update(ctx, ref, req)
	if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "in IPv6 only") || !strings.Contains(err.Error(), "add the clients' ranges of the cluster's family") {
		t.Errorf("Update on a cluster refusing IPv6 Services = %v; want Permanent, naming the family", err)
	}
}

// A Create whose child could not be written (the API server refused the
// NetworkPolicy once) leaves a Deployment that already carries the spec
// hash: Get must report it out of date until an Update has written every
// child, or the proxy would serve without its NetworkPolicy for good.
func TestCreateWithAFailedChildIsCompletedByUpdate(t *testing.T) {
	ctx := context.Background()
	req := testRequest()
	failNP := true
	fc := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*networkingv1.NetworkPolicy); ok && failNP {
				failNP = false
				return kerrors.NewInternalError(fmt.Errorf("etcdserver: request timed out"))
			}
			obj.SetCreationTimestamp(metav1.Now())
			return cl.Create(ctx, obj, opts...)
		},
	}).Build()
	d := New(Options{Provider: "ClusterProviderConfig pods", Config: Config{Namespace: "egress", NetworkPolicy: true}, Client: fc, Live: fc})
	d.taken = &taken{}
	if _, err := d.Create(ctx, req); err == nil || !strings.Contains(err.Error(), "NetworkPolicy egress/"+req.Name) {
		t.Fatalf("Create with the NetworkPolicy refused = %v; want an error naming it", err)
	}
	ref := proxy.Ref{Name: req.Name, Mark: req.Mark}
	key := types.NamespacedName{Namespace: "egress", Name: req.Name}
	for _, step := range []struct {
		name         string
		update       bool
		wantUpToDate bool
		wantPolicy   bool
	}{
		{name: "after the failed Create", wantUpToDate: false, wantPolicy: false},
		{name: "after Update", update: true, wantUpToDate: true, wantPolicy: true},
	} {
		if step.update {
			if _, err := d.Update(ctx, ref, req); err != nil {
				t.Fatalf("Update: %v", err)
			}
		}
		inst, err := d.Get(ctx, ref)
		if err != nil {
			t.Fatalf("%s: Get: %v", step.name, err)
		}
		got := struct{ UpToDate, Policy bool }{inst.SpecHash == proxy.Hash(req), fc.Get(ctx, key, &networkingv1.NetworkPolicy{}) == nil}
		want := struct{ UpToDate, Policy bool }{step.wantUpToDate, step.wantPolicy}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step.name, diff)
		}
	}
}

// A proxy whose Create failed a child, deleted and created again in full,
// reads as up to date at once: no Update for a failure of the past.
func TestCreateAfterAnUnfinishedOneIsUpToDate(t *testing.T) {
	ctx := context.Background()
	req := testRequest()
	failNP := true
	fc := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*networkingv1.NetworkPolicy); ok && failNP {
				failNP = false
				return kerrors.NewInternalError(fmt.Errorf("etcdserver: request timed out"))
			}
			obj.SetCreationTimestamp(metav1.Now())
			return cl.Create(ctx, obj, opts...)
		},
	}).Build()
	d := New(Options{Provider: "ClusterProviderConfig pods", Config: Config{Namespace: "egress", NetworkPolicy: true}, Client: fc, Live: fc})
	d.taken = &taken{}
	if _, err := d.Create(ctx, req); err == nil {
		t.Fatal("Create with the NetworkPolicy refused succeeded")
	}
	key := types.NamespacedName{Namespace: "egress", Name: req.Name}
	for _, o := range []client.Object{&appsv1.Deployment{}, &corev1.Secret{}} {
		if err := fc.Get(ctx, key, o); err != nil {
			t.Fatal(err)
		}
		if err := fc.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Create(ctx, req); err != nil {
		t.Fatalf("the second Create: %v", err)
	}
	inst, err := d.Get(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(proxy.Hash(req), inst.SpecHash); diff != "" {
		t.Errorf("spec hash after a full Create (-want +got):\n%s", diff)
	}
}
