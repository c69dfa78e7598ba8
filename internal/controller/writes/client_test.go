package writes

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
)

// counted returns a fake API server holding objs and a counter of the
// writes it received.
func counted(t *testing.T, objs ...client.Object) (client.Client, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).WithStatusSubresource(&nsproxy.KVMProxy{}).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				n.Add(1)
				return c.Create(ctx, obj, opts...)
			},
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				n.Add(1)
				return c.Update(ctx, obj, opts...)
			},
			Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
				n.Add(1)
				return c.Patch(ctx, obj, p, opts...)
			},
			SubResourceUpdate: func(ctx context.Context, c client.Client, _ string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				n.Add(1)
				return c.Status().Update(ctx, obj, opts...)
			},
		}).Build()
	return c, &n
}

func kvmProxy() *nsproxy.KVMProxy {
	return &nsproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p", UID: "uid-1"}}
}

func TestClientLeavesOutWhatTheServerHolds(t *testing.T) {
	type step func(ctx context.Context, c *Client, obj *nsproxy.KVMProxy) error
	// One transition time for every write: metav1.Now() has whole
	// seconds, so two writes of one message a second apart would differ.
	at := metav1.NewTime(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	setStatus := func(msg string) step {
		return func(ctx context.Context, c *Client, obj *nsproxy.KVMProxy) error {
			cond := xpv2.Creating().WithMessage(msg)
			cond.LastTransitionTime = at
			obj.SetConditions(cond)
			return c.Status().Update(ctx, obj)
		}
	}
	cases := map[string]struct {
		steps []step
		// stale, when set, runs after steps on a copy of the object as it
		// was before them (a read from a cache that has not caught up).
		stale      step
		wantWrites int64
		wantErr    bool
	}{
		"UnchangedStatusIsNotSent": {
			steps:      []step{func(ctx context.Context, c *Client, obj *nsproxy.KVMProxy) error { return c.Status().Update(ctx, obj) }},
			wantWrites: 0,
		},
		"ChangedStatusIsSentOnce": {
			steps:      []step{setStatus("a"), setStatus("a")},
			wantWrites: 1,
		},
		"EveryChangeIsSent": {
			steps:      []step{setStatus("a"), setStatus("b"), setStatus("a")},
			wantWrites: 3,
		},
		"StaleReadOfOwnWriteIsNotSent": {
			steps:      []step{setStatus("a")},
			stale:      setStatus("a"),
			wantWrites: 1,
		},
		"StaleReadWithOtherContentIsSentAndConflicts": {
			steps:      []step{setStatus("a")},
			stale:      setStatus("b"),
			wantWrites: 2,
			wantErr:    true,
		},
		"PendingAnnotationAloneIsNotSent": {
			steps: []step{func(ctx context.Context, c *Client, obj *nsproxy.KVMProxy) error {
				meta.SetExternalCreatePending(obj, time.Now())
				return c.Update(ctx, obj)
			}},
			wantWrites: 0,
		},
		"PendingAnnotationLandsWithTheNextChange": {
			steps: []step{func(ctx context.Context, c *Client, obj *nsproxy.KVMProxy) error {
				meta.SetExternalCreatePending(obj, time.Now())
				if err := c.Update(ctx, obj); err != nil {
					return err
				}
				meta.SetExternalCreateSucceeded(obj, time.Now())
				return c.Update(ctx, obj)
			}},
			wantWrites: 1,
		},
		"UpdateWithOptionsIsAlwaysSent": {
			steps: []step{func(ctx context.Context, c *Client, obj *nsproxy.KVMProxy) error {
				return c.Update(ctx, obj, client.FieldOwner("test"))
			}},
			wantWrites: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			server, writes := counted(t, kvmProxy())
			c := NewClient(server, nil, nil)
			obj := &nsproxy.KVMProxy{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(kvmProxy()), obj); err != nil {
				t.Fatal(err)
			}
			before := obj.DeepCopy()
			for i, s := range tc.steps {
				if err := s(ctx, c, obj); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			var err error
			if tc.stale != nil {
				err = tc.stale(ctx, c, before)
			}
			if (err != nil) != tc.wantErr {
				t.Errorf("stale write error = %v, want error %v", err, tc.wantErr)
			}
			if got := writes.Load(); got != tc.wantWrites {
				t.Errorf("%d writes reached the server, want %d", got, tc.wantWrites)
			}
		})
	}
}

// A version is a name, not a number: versions that do not parse as
// numbers are handled like any other.
func TestClientComparesVersionsOnlyForEquality(t *testing.T) {
	c := NewClient(nil, nil, nil)
	obj := kvmProxy()
	obj.SetResourceVersion("b")
	c.read(obj)
	if !c.unchanged(obj, true) {
		t.Error("an object at the version just read is not unchanged")
	}
	newer := obj.DeepCopy()
	newer.SetResourceVersion("c")
	newer.SetConditions(xpv2.Available())
	c.wrote(newer, "b")
	stale := obj.DeepCopy()
	stale.SetConditions(xpv2.Available())
	if !c.unchanged(stale, true) {
		t.Error("a read at the version this client's write replaced, with the written status, is not unchanged")
	}
	other := stale.DeepCopy()
	other.SetResourceVersion("a")
	if c.unchanged(other, true) {
		t.Error("a version this client never saw counts as unchanged")
	}
	// A later read of the replaced version keeps the written state.
	c.read(obj)
	if !c.unchanged(newer, true) {
		t.Error("a stale read replaced the state this client wrote")
	}
}

// The status is compared alone (statusDigest), for typed objects by their
// Status field and for unstructured ones by their "status": a change of
// anything else is not a status change, and a status change is one.
func TestClientComparesTheStatusAlone(t *testing.T) {
	typed := func(host string, conds ...xpv2.Condition) client.Object {
		p := kvmProxy()
		p.Spec.ForProvider.Host = host
		p.SetConditions(conds...)
		return p
	}
	unstr := func(labels map[string]string, state string) client.Object {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(nsproxy.KVMProxyGroupVersionKind.GroupVersion().String())
		u.SetKind(nsproxy.KVMProxyKind)
		u.SetNamespace("team-a")
		u.SetName("u")
		u.SetLabels(labels)
		u.Object["status"] = map[string]any{"atProvider": map[string]any{"state": state}}
		return u
	}
	for name, tc := range map[string]struct {
		obj, otherChanged, statusChanged client.Object
	}{
		"Typed": {
			obj:           typed("h1"),
			otherChanged:  typed("h2"),
			statusChanged: typed("h1", xpv2.Available()),
		},
		"Unstructured": {
			obj:           unstr(nil, "Running"),
			otherChanged:  unstr(map[string]string{"a": "b"}, "Running"),
			statusChanged: unstr(nil, "Stopped"),
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := NewClient(nil, nil, nil)
			for _, o := range []client.Object{tc.obj, tc.otherChanged, tc.statusChanged} {
				o.SetResourceVersion("1")
			}
			c.read(tc.obj)
			if !c.unchanged(tc.obj, true) {
				t.Error("the object just read counts as changed (was its status taken from it?)")
			}
			if !c.unchanged(tc.otherChanged, true) {
				t.Error("a change outside the status counts as a status change")
			}
			if c.unchanged(tc.otherChanged, false) {
				t.Error("a change outside the status does not count as a change of the object")
			}
			if c.unchanged(tc.statusChanged, true) {
				t.Error("a status change does not count as one")
			}
		})
	}
}

func TestClientConnectionSecrets(t *testing.T) {
	ctx := context.Background()
	server, writes := counted(t)
	c := NewClient(server, server, func() bool { return true })
	empty := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p-conn"}, Type: resource.SecretTypeConnection}
	if err := c.Create(ctx, empty); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load(); n != 0 {
		t.Errorf("an empty connection Secret sent %d writes, want 0", n)
	}
	opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "other"}}
	if err := c.Create(ctx, opaque); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load(); n != 1 {
		t.Errorf("an empty Secret of another type sent %d writes, want 1: only connection Secrets are left out", n)
	}
	full := empty.DeepCopy()
	full.Data = map[string][]byte{"url": []byte("http://10.0.0.1:3128")}
	if err := c.Create(ctx, full); err != nil {
		t.Fatal(err)
	}
	got := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(full), got); err != nil || string(got.Data["url"]) != "http://10.0.0.1:3128" {
		t.Errorf("the connection Secret reads back %q, %v", got.Data, err)
	}
}

// A Secret this client created is read from the API server on a miss in
// the watch only within createdWindow of its creation, and the record of
// the creations is let go once they are older, on reads as on creates:
// a burst of creates leaves nothing behind once it is over.
func TestClientForgetsCreatedSecretsAfterTheWindow(t *testing.T) {
	ctx := context.Background()
	server, _ := counted(t)
	misses := &missing{}
	live := &countingReader{Reader: server}
	c := NewClient(server, misses, func() bool { return true })
	now := time.Unix(1000, 0)
	c.secrets.now = func() time.Time { return now }
	for _, name := range []string{"a", "b", "c"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name}, Type: resource.SecretTypeConnection,
			Data: map[string][]byte{"url": []byte("http://10.0.0.1:3128")}}
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	key := client.ObjectKey{Namespace: "team-a", Name: "a"}
	if err := c.secrets.get(ctx, live, key, &corev1.Secret{}); err != nil {
		t.Errorf("a Secret created a moment ago, not in the watch yet: %v, want it read from the API server", err)
	}
	if live.n != 1 {
		t.Errorf("%d reads from the API server, want 1", live.n)
	}
	now = now.Add(2 * createdWindow)
	if err := c.secrets.get(ctx, live, key, &corev1.Secret{}); !kerrors.IsNotFound(err) {
		t.Errorf("a miss in the watch %v after the create: %v, want NotFound as the watch says", 2*createdWindow, err)
	}
	if live.n != 1 {
		t.Errorf("%d reads from the API server, want still 1", live.n)
	}
	c.secrets.mu.Lock()
	left := len(c.secrets.created)
	c.secrets.mu.Unlock()
	if left != 0 {
		t.Errorf("%d creations still recorded after the window, want none", left)
	}
}

// missing is a watch that holds nothing.
type missing struct{ client.Reader }

func (missing) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	return kerrors.NewNotFound(corev1.Resource("secrets"), key.Name)
}

// countingReader counts its Gets.
type countingReader struct {
	client.Reader
	n int
}

func (r *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	r.n++
	return r.Reader.Get(ctx, key, obj, opts...)
}

// lagging is a manager's cache that has not caught up: its Get serves
// stale (when set) for the next lag reads (every read when lag < 0), then
// the server's object, or gone when set. It counts its Gets.
type lagging struct {
	client.Client
	stale *nsproxy.KVMProxy
	lag   int
	gone  bool
	reads int
}

func (l *lagging) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	l.reads++
	if l.stale != nil && l.lag != 0 {
		l.lag--
		l.stale.DeepCopyInto(obj.(*nsproxy.KVMProxy)) //nolint:forcetypeassert // The tests read KVMProxies.
		return nil
	}
	if l.gone {
		return kerrors.NewNotFound(nsproxy.SchemeGroupVersion.WithResource("kvmproxies").GroupResource(), key.Name)
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

// afterOwnWrite returns a client whose reader lags behind its own status
// write: the object as read before the write, and as written.
func afterOwnWrite(t *testing.T) (*Client, *lagging, *nsproxy.KVMProxy, *nsproxy.KVMProxy) {
	t.Helper()
	ctx := context.Background()
	server, _ := counted(t, kvmProxy())
	l := &lagging{Client: server}
	c := NewClient(l, nil, nil)
	c.catchUpEvery, c.catchUpFor = time.Millisecond, 20*time.Millisecond
	before := &nsproxy.KVMProxy{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(kvmProxy()), before); err != nil {
		t.Fatal(err)
	}
	written := before.DeepCopy()
	written.SetConditions(xpv2.Creating())
	if err := c.Status().Update(ctx, written); err != nil {
		t.Fatal(err)
	}
	l.stale, l.reads = before, 0
	return c, l, before, written
}

// A read at a version this client's own write replaced (a cache that has
// not received the write's watch event) waits for the cache to hold the
// write, so the status computed from it is not refused with a conflict.
func TestClientGetWaitsForItsOwnWrite(t *testing.T) {
	ctx := context.Background()
	c, l, _, written := afterOwnWrite(t)
	c.catchUpFor = time.Minute // The cache catches up: no bound is reached.
	l.lag = 3
	got := &nsproxy.KVMProxy{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(written), got); err != nil {
		t.Fatal(err)
	}
	if got.GetResourceVersion() != written.GetResourceVersion() {
		t.Fatalf("Get returned version %s, want %s (the client's own write)", got.GetResourceVersion(), written.GetResourceVersion())
	}
	if l.reads != 4 {
		t.Errorf("%d reads, want 4 (3 stale, then the write)", l.reads)
	}
	got.SetConditions(xpv2.Available())
	if err := c.Status().Update(ctx, got); err != nil {
		t.Errorf("the status update after the read = %v, want it accepted", err)
	}
}

// Deleted while the cache still held a replaced version: NotFound, and
// the object is forgotten.
func TestClientGetWaitingForItsOwnWriteSeesItGone(t *testing.T) {
	c, l, _, written := afterOwnWrite(t)
	c.catchUpFor = time.Minute
	l.lag, l.gone = 2, true
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(written), &nsproxy.KVMProxy{}); !kerrors.IsNotFound(err) {
		t.Fatalf("Get = %v, want NotFound", err)
	}
	if _, ok := c.seen[seenKey(written)]; ok {
		t.Error("an object gone is still noted")
	}
}

// A cache that never catches up costs the bound at most: Get then returns
// the stale read as it did before, the client keeps the state it wrote,
// and a different status from that read conflicts as it always did.
func TestClientGetWaitsForItsOwnWriteAtMostTheBound(t *testing.T) {
	ctx := context.Background()
	c, l, before, written := afterOwnWrite(t)
	l.lag = -1
	got := &nsproxy.KVMProxy{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(written), got); err != nil {
		t.Fatal(err)
	}
	if got.GetResourceVersion() != before.GetResourceVersion() {
		t.Errorf("Get returned version %s, want the stale %s", got.GetResourceVersion(), before.GetResourceVersion())
	}
	if l.reads < 2 {
		t.Errorf("%d reads, want it to have read again", l.reads)
	}
	if !c.unchanged(written, true) {
		t.Error("the stale read replaced the state this client wrote")
	}
	got.SetConditions(xpv2.Available())
	if err := c.Status().Update(ctx, got); !kerrors.IsConflict(err) {
		t.Errorf("a different status from the stale read = %v, want a conflict", err)
	}

	// A context done ends the wait too.
	done, cancel := context.WithCancel(ctx)
	cancel()
	c.catchUpFor = time.Hour
	if err := c.Get(done, client.ObjectKeyFromObject(written), &nsproxy.KVMProxy{}); err != nil {
		t.Errorf("Get with a done context = %v, want the stale read", err)
	}
}

// Only the client's own writes make a read wait: a read at any other
// version is one read.
func TestClientGetDoesNotWaitOtherwise(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]func(t *testing.T, c *Client, l *lagging, before, written *nsproxy.KVMProxy) client.Object{
		"NeverWritten": func(t *testing.T, _ *Client, l *lagging, _, _ *nsproxy.KVMProxy) client.Object {
			t.Helper()
			other := kvmProxy()
			other.SetName("other")
			other.SetResourceVersion("")
			if err := l.Client.Create(ctx, other); err != nil {
				t.Fatal(err)
			}
			l.stale = nil
			return other
		},
		"AtTheVersionWritten": func(_ *testing.T, _ *Client, l *lagging, _, written *nsproxy.KVMProxy) client.Object {
			l.stale = nil
			return written
		},
		"AtAnotherWritersVersion": func(t *testing.T, _ *Client, l *lagging, _, written *nsproxy.KVMProxy) client.Object {
			t.Helper()
			other := written.DeepCopy()
			other.SetLabels(map[string]string{"changed": "elsewhere"})
			if err := l.Client.Update(ctx, other); err != nil {
				t.Fatal(err)
			}
			l.stale = nil
			return other
		},
		"AtAVersionNeverSeen": func(_ *testing.T, _ *Client, l *lagging, before, _ *nsproxy.KVMProxy) client.Object {
			older := before.DeepCopy()
			older.SetResourceVersion("1")
			l.stale, l.lag = older, -1
			return older
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, l, before, written := afterOwnWrite(t)
			c.catchUpFor = time.Hour // A wait would not end.
			obj := tc(t, c, l, before, written)
			l.reads = 0
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &nsproxy.KVMProxy{}); err != nil {
				t.Fatal(err)
			}
			if l.reads != 1 {
				t.Errorf("%d reads, want 1", l.reads)
			}
		})
	}
}

func TestClientForgetsWhatItDeleted(t *testing.T) {
	ctx := context.Background()
	kube, _ := counted(t, kvmProxy())
	c := NewClient(kube, nil, nil)
	obj := kvmProxy()
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, obj); err != nil {
		t.Fatal(err)
	}
	// Deleted again (gone already): still nothing kept.
	if err := c.Delete(ctx, kvmProxy()); !kerrors.IsNotFound(err) {
		t.Fatalf("second Delete: %v, want NotFound", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.seen) != 0 {
		t.Errorf("the client keeps %d entries after deleting the only object it read, want none", len(c.seen))
	}
}

// TestDigestOfATypedObject: a typed object's digest leaves out what a
// write does not change (its type, status, managed fields, version and
// pending annotation), keeps the rest, and leaves the object as it was.
func TestDigestOfATypedObject(t *testing.T) {
	obj := kvmProxy()
	obj.SetAnnotations(map[string]string{meta.AnnotationKeyExternalCreatePending: "now", "keep": "x"})
	obj.SetResourceVersion("3")
	obj.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "m"}})
	obj.SetConditions(xpv2.Available())
	base, _, err := digests(obj)
	if err != nil {
		t.Fatal(err)
	}
	if len(obj.GetAnnotations()) != 2 || obj.GetResourceVersion() != "3" || len(obj.GetManagedFields()) != 1 || len(obj.Status.Conditions) != 1 {
		t.Fatalf("digests changed the object: %+v", obj)
	}
	same := obj.DeepCopy()
	same.APIVersion, same.Kind = "proxy.m.egressproxy.io/v1alpha1", "KVMProxy"
	same.SetResourceVersion("4")
	same.SetManagedFields(nil)
	same.SetAnnotations(map[string]string{"keep": "x"})
	same.SetConditions(xpv2.Creating())
	if d, _, _ := digests(same); d != base {
		t.Error("the digest depends on the type, version, managed fields, status or pending annotation")
	}
	other := obj.DeepCopy()
	other.SetAnnotations(map[string]string{"keep": "y"})
	if d, _, _ := digests(other); d == base {
		t.Error("the digest does not see an annotation's change")
	}
}

// TestClientNotesOnlyManagedResources: a finalizer reads and patches the
// status of a tenant's ProviderConfig through the client (recording a
// release); nothing reads it again once its namespace is gone, so the
// client keeps nothing of it. A managed resource read is still noted.
func TestClientNotesOnlyManagedResources(t *testing.T) {
	ctx := context.Background()
	pc := &nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "kvm"}}
	live := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(pc, kvmProxy()).WithStatusSubresource(pc).Build()
	c := NewClient(live, nil, nil)
	got := &nsv1alpha1.ProviderConfig{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pc), got); err != nil {
		t.Fatal(err)
	}
	orig := got.DeepCopy()
	got.Status.Users = 1
	if err := c.Status().Patch(ctx, got, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(kvmProxy()), &nsproxy.KVMProxy{}); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.seen {
		if k.t != reflect.TypeFor[*nsproxy.KVMProxy]() {
			t.Errorf("the client keeps %s %s/%s, which no reconcile reads again", k.t, k.namespace, k.name)
		}
	}
	if len(c.seen) != 1 {
		t.Errorf("the client notes %d objects; want the managed resource read", len(c.seen))
	}
}
