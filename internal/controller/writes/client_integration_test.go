package writes_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/writes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// countingTransport counts the requests sent through it.
type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// TestClientIntegration checks, on a real API server, which writes
// the writes.Client leaves out (by counting the requests it sends) and that
// what the server holds is what a plain client would have written.
func TestClientIntegration(t *testing.T) {
	cp, s := testenv.Start(t, controlplane.Options{})
	var sent atomic.Int64
	counted := rest.CopyConfig(cp.Config)
	counted.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, n: &sent} }
	inner, err := client.New(counted, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := client.New(cp.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	secrets, err := writes.ConnectionSecretCache(cp.Config, s)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = secrets.Start(ctx) }()
	if !secrets.WaitForCacheSync(ctx) {
		t.Fatal("the connection Secret cache did not sync")
	}
	informer, err := secrets.GetInformer(ctx, &corev1.Secret{})
	if err != nil {
		t.Fatal(err)
	}
	sc := writes.NewClient(inner, secrets, informer.HasSynced)

	// requests runs fn and returns how many requests it sent.
	requests := func(t *testing.T, what string, fn func() error) int64 {
		t.Helper()
		before := sent.Load()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return sent.Load() - before
	}
	if err := plain.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	mr := &nsproxy.KVMProxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p"},
		Spec: nsproxy.KVMProxySpec{
			ManagedResourceSpec: xpv2.ManagedResourceSpec{WriteConnectionSecretToReference: &xpv2.LocalSecretReference{Name: "p-conn"}},
			ForProvider:         spec.KVMProxyParameters{Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.0.0.0/8"}}},
		},
	}
	if err := plain.Create(ctx, mr); err != nil {
		t.Fatal(err)
	}
	live := func(t *testing.T) *nsproxy.KVMProxy {
		t.Helper()
		got := &nsproxy.KVMProxy{}
		if err := plain.Get(ctx, client.ObjectKeyFromObject(mr), got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	// The first requests of a client discover the API; then a Get is one.
	obj := &nsproxy.KVMProxy{}
	if err := sc.Get(ctx, client.ObjectKeyFromObject(mr), obj); err != nil {
		t.Fatal(err)
	}
	if err := sc.Get(ctx, client.ObjectKeyFromObject(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "none"}}), &corev1.Secret{}); !kerrors.IsNotFound(err) {
		t.Fatalf("Get of a missing Secret = %v, want NotFound", err)
	}
	if n := requests(t, "Get", func() error { return sc.Get(ctx, client.ObjectKeyFromObject(mr), obj) }); n != 1 {
		t.Errorf("Get sent %d requests, want 1", n)
	}

	t.Run("StatusUnchangedIsNotSent", func(t *testing.T) {
		if n := requests(t, "status update", func() error { return sc.Status().Update(ctx, obj) }); n != 0 {
			t.Errorf("an unchanged status sent %d requests, want 0", n)
		}
	})
	t.Run("StatusChangedIsSentOnce", func(t *testing.T) {
		obj.SetConditions(xpv2.Creating().WithMessage("waiting"))
		obj.Status.AtProvider.Progress = "waiting for the pod"
		if n := requests(t, "status update", func() error { return sc.Status().Update(ctx, obj) }); n != 1 {
			t.Errorf("a changed status sent %d requests, want 1", n)
		}
		got := live(t)
		if got.Status.AtProvider.Progress != "waiting for the pod" || got.GetCondition(xpv2.TypeReady).Message != "waiting" {
			t.Errorf("the server holds status %+v, want the written one", got.Status)
		}
		// The same conditions again (crossplane-runtime keeps an equal
		// condition's transition time) change nothing.
		obj.SetConditions(xpv2.Creating().WithMessage("waiting"))
		if n := requests(t, "status update", func() error { return sc.Status().Update(ctx, obj) }); n != 0 {
			t.Errorf("the same status again sent %d requests, want 0", n)
		}
	})
	t.Run("StaleReadOfOwnWriteIsNotSent", func(t *testing.T) {
		before := obj.DeepCopy()
		obj.SetConditions(xpv2.Creating().WithMessage("stale check"))
		if n := requests(t, "status update", func() error { return sc.Status().Update(ctx, obj) }); n != 1 {
			t.Errorf("a changed status sent %d requests, want 1", n)
		}
		// The same status computed from a read older than that write (a
		// cache that has not caught up): the server holds it already.
		before.SetConditions(xpv2.Creating().WithMessage("stale check"))
		if n := requests(t, "status update", func() error { return sc.Status().Update(ctx, before) }); n != 0 {
			t.Errorf("the written status again from an older read sent %d requests, want 0", n)
		}
		// Another status from the older read is sent, and conflicts.
		before.SetConditions(xpv2.Available())
		if err := sc.Status().Update(ctx, before); !kerrors.IsConflict(err) {
			t.Errorf("another status from an older read = %v, want a conflict", err)
		}
	})
	t.Run("PendingAnnotationAloneIsNotSent", func(t *testing.T) {
		meta.SetExternalCreatePending(obj, time.Now())
		rv := obj.GetResourceVersion()
		if n := requests(t, "update", func() error { return sc.Update(ctx, obj) }); n != 0 {
			t.Errorf("an update of the pending annotation alone sent %d requests, want 0", n)
		}
		if obj.GetResourceVersion() != rv {
			t.Errorf("resourceVersion changed from %s to %s without a write", rv, obj.GetResourceVersion())
		}
		// It lands with the next real change, as crossplane-runtime's
		// critical-annotation update after Create makes one.
		meta.SetExternalCreateSucceeded(obj, time.Now())
		if n := requests(t, "update", func() error { return sc.Update(ctx, obj) }); n != 1 {
			t.Errorf("an update of the succeeded annotation sent %d requests, want 1", n)
		}
		got := live(t)
		if _, ok := got.GetAnnotations()[meta.AnnotationKeyExternalCreatePending]; !ok {
			t.Error("the pending annotation never reached the server")
		}
		if _, ok := got.GetAnnotations()[meta.AnnotationKeyExternalCreateSucceeded]; !ok {
			t.Error("the succeeded annotation did not reach the server")
		}
	})
	t.Run("StaleObjectStillConflicts", func(t *testing.T) {
		stale := obj.DeepCopy()
		other := live(t)
		other.SetLabels(map[string]string{"changed": "elsewhere"})
		if err := plain.Update(ctx, other); err != nil {
			t.Fatal(err)
		}
		stale.SetConditions(xpv2.Available())
		err := sc.Status().Update(ctx, stale)
		if !kerrors.IsConflict(err) {
			t.Errorf("a status update of a stale object = %v, want a conflict", err)
		}
		// Unchanged and stale: left out, as it would have conflicted.
		if err := sc.Get(ctx, client.ObjectKeyFromObject(mr), obj); err != nil {
			t.Fatal(err)
		}
	})

	// crossplane-runtime's own connection publisher, on the writes.Client
	// (as the managed reconciler builds it).
	pub := managed.NewAPILocalSecretPublisher(sc, s)
	connKey := client.ObjectKey{Namespace: "team-a", Name: "p-conn"}
	secretData := func(t *testing.T) (map[string][]byte, bool) {
		t.Helper()
		got := &corev1.Secret{}
		err := plain.Get(ctx, connKey, got)
		if kerrors.IsNotFound(err) {
			return nil, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return got.Data, true
	}
	waitCached := func(t *testing.T, present bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := secrets.Get(ctx, connKey, &corev1.Secret{})
			if (err == nil) == present {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the connection Secret cache did not see the Secret present=%v: %v", present, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	details := managed.ConnectionDetails{"url": []byte("http://10.0.0.1:3128"), "host": []byte("10.0.0.1"), "port": []byte("3128")}

	t.Run("NothingToPublishWritesNothing", func(t *testing.T) {
		if n := requests(t, "publish", func() error { _, err := pub.PublishConnection(ctx, obj, nil); return err }); n != 0 {
			t.Errorf("publishing no details sent %d requests, want 0", n)
		}
		if _, ok := secretData(t); ok {
			t.Error("an empty connection Secret was created")
		}
	})
	t.Run("FirstDetailsCreateTheSecretInOneRequest", func(t *testing.T) {
		if n := requests(t, "publish", func() error { _, err := pub.PublishConnection(ctx, obj, details); return err }); n != 1 {
			t.Errorf("the first publish sent %d requests, want 1 (the create)", n)
		}
		data, ok := secretData(t)
		if !ok || string(data["url"]) != "http://10.0.0.1:3128" {
			t.Errorf("connection Secret data %q (exists %v), want the details", data, ok)
		}
		// Right after, before the watch delivered it: still correct.
		if _, err := pub.PublishConnection(ctx, obj, details); err != nil {
			t.Errorf("publishing again at once: %v", err)
		}
	})
	t.Run("UnchangedDetailsSendNothing", func(t *testing.T) {
		waitCached(t, true)
		if n := requests(t, "publish", func() error { _, err := pub.PublishConnection(ctx, obj, details); return err }); n != 0 {
			t.Errorf("publishing the same details sent %d requests, want 0", n)
		}
	})
	t.Run("EmptyDetailsKeepTheLastOnes", func(t *testing.T) {
		if n := requests(t, "publish", func() error { _, err := pub.PublishConnection(ctx, obj, managed.ConnectionDetails{}); return err }); n != 0 {
			t.Errorf("publishing empty details sent %d requests, want 0", n)
		}
		if data, _ := secretData(t); string(data["url"]) != "http://10.0.0.1:3128" {
			t.Errorf("connection Secret data %q, want the last details kept", data)
		}
	})
	t.Run("ChangedDetailsAreWritten", func(t *testing.T) {
		changed := managed.ConnectionDetails{"url": []byte("http://10.0.0.2:3128"), "host": []byte("10.0.0.2"), "port": []byte("3128")}
		if n := requests(t, "publish", func() error { _, err := pub.PublishConnection(ctx, obj, changed); return err }); n != 1 {
			t.Errorf("publishing changed details sent %d requests, want 1", n)
		}
		if data, _ := secretData(t); string(data["host"]) != "10.0.0.2" {
			t.Errorf("connection Secret data %q, want the changed details", data)
		}
	})
	t.Run("DeletedSecretIsWrittenAgain", func(t *testing.T) {
		if err := plain.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: connKey.Namespace, Name: connKey.Name}}); err != nil {
			t.Fatal(err)
		}
		waitCached(t, false)
		if _, err := pub.PublishConnection(ctx, obj, details); err != nil {
			t.Fatal(err)
		}
		if data, ok := secretData(t); !ok || string(data["url"]) != "http://10.0.0.1:3128" {
			t.Errorf("connection Secret data %q (exists %v) after it was deleted, want it written again", data, ok)
		}
	})
	t.Run("ForeignSecretIsRefused", func(t *testing.T) {
		foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "taken"}, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"k": []byte("v")}}
		if err := plain.Create(ctx, foreign); err != nil {
			t.Fatal(err)
		}
		other := obj.DeepCopy()
		other.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "taken"}
		if _, err := pub.PublishConnection(ctx, other, details); err == nil {
			t.Error("publishing over another's Secret succeeded; want an error")
		}
		got := &corev1.Secret{}
		if err := plain.Get(ctx, client.ObjectKeyFromObject(foreign), got); err != nil {
			t.Fatal(err)
		}
		if string(got.Data["k"]) != "v" || len(got.Data) != 1 {
			t.Errorf("another's Secret was changed: %q", got.Data)
		}
	})
	ref := metav1.NewControllerRef(obj, nsproxy.KVMProxyGroupVersionKind)
	// waitHeld waits until the connection Secret cache holds key.
	waitHeld := func(t *testing.T, key client.ObjectKey) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for secrets.Get(ctx, key, &corev1.Secret{}) != nil {
			if time.Now().After(deadline) {
				t.Fatalf("the connection Secret cache does not hold %s", key)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Run("OthersConnectionSecretsAreNotWatched", func(t *testing.T) {
		// Another provider's, then this one's: the watch delivers them in
		// that order, so once it holds the second it has passed the first.
		others := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "db-conn"}, Type: resource.SecretTypeConnection, Data: map[string][]byte{"password": []byte("another provider's")}}
		if err := plain.Create(ctx, others); err != nil {
			t.Fatal(err)
		}
		mine := obj.DeepCopy()
		mine.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "after-conn"}
		if _, err := pub.PublishConnection(ctx, mine, details); err != nil {
			t.Fatal(err)
		}
		after := client.ObjectKey{Namespace: "team-a", Name: "after-conn"}
		waitHeld(t, after)
		if err := secrets.Get(ctx, client.ObjectKeyFromObject(others), &corev1.Secret{}); !kerrors.IsNotFound(err) {
			t.Errorf("the connection Secret cache holds another provider's Secret (Get = %v); want NotFound", err)
		}
		got := &corev1.Secret{}
		if err := plain.Get(ctx, after, got); err != nil || got.Labels[writes.LabelManagedBy] != writes.ManagedBy {
			t.Errorf("the published Secret's labels %v (%v), want %s=%s", got.Labels, err, writes.LabelManagedBy, writes.ManagedBy)
		}
	})
	t.Run("UnlabelledOwnSecretIsTakenOver", func(t *testing.T) {
		// As an older provider, or one under --all-writes, wrote it: no
		// label, a key the details no longer hold, and a key of another.
		old := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "old-conn", OwnerReferences: []metav1.OwnerReference{*ref}},
			Type:       resource.SecretTypeConnection,
			Data:       map[string][]byte{"url": []byte("http://10.0.0.9:3128"), "password": []byte("old"), "note": []byte("someone else's")},
		}
		if err := plain.Create(ctx, old); err != nil {
			t.Fatal(err)
		}
		sc.ConnectionKeys = []string{"url", "host", "port", "password"}
		defer func() { sc.ConnectionKeys = nil }()
		mine := obj.DeepCopy()
		mine.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "old-conn"}
		if _, err := pub.PublishConnection(ctx, mine, details); err != nil {
			t.Fatalf("publishing over its own unlabelled Secret: %v", err)
		}
		got := &corev1.Secret{}
		if err := plain.Get(ctx, client.ObjectKeyFromObject(old), got); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"url": "http://10.0.0.1:3128", "host": "10.0.0.1", "port": "3128", "note": "someone else's"}
		if len(got.Data) != len(want) || got.Labels[writes.LabelManagedBy] != writes.ManagedBy {
			t.Errorf("the Secret holds %q, labels %v; want %v and the label", got.Data, got.Labels, want)
		}
		for k, v := range want {
			if string(got.Data[k]) != v {
				t.Errorf("the Secret's %s is %q, want %q", k, got.Data[k], v)
			}
		}
		// Held by the watch from now on.
		waitHeld(t, client.ObjectKeyFromObject(old))
	})
	t.Run("UnlabelledSecretWithoutOwnerIsTaken", func(t *testing.T) {
		// A connection Secret left without its owner (its resource deleted
		// with --cascade=orphan): crossplane-runtime takes one, and so does
		// this client, labelled or not.
		left := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "left-conn"}, Type: resource.SecretTypeConnection, Data: map[string][]byte{"url": []byte("http://10.0.0.9:3128")}}
		if err := plain.Create(ctx, left); err != nil {
			t.Fatal(err)
		}
		mine := obj.DeepCopy()
		mine.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "left-conn"}
		if _, err := pub.PublishConnection(ctx, mine, details); err != nil {
			t.Fatalf("publishing over a connection Secret without an owner: %v", err)
		}
		got := &corev1.Secret{}
		if err := plain.Get(ctx, client.ObjectKeyFromObject(left), got); err != nil {
			t.Fatal(err)
		}
		if c := metav1.GetControllerOf(got); c == nil || c.UID != obj.GetUID() || string(got.Data["url"]) != "http://10.0.0.1:3128" || got.Labels[writes.LabelManagedBy] != writes.ManagedBy {
			t.Errorf("the Secret's controller %v, data %q, labels %v; want this resource, the details and the label", c, got.Data, got.Labels)
		}
	})
	t.Run("OpaqueSecretOfTheSameResourceIsLeft", func(t *testing.T) {
		// A legacy (Opaque) connection Secret of the same resource: its
		// type cannot change, so it is not written into.
		legacy := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "legacy-conn", OwnerReferences: []metav1.OwnerReference{*ref}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"a": []byte("b")},
		}
		if err := plain.Create(ctx, legacy); err != nil {
			t.Fatal(err)
		}
		mine := obj.DeepCopy()
		mine.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "legacy-conn"}
		if _, err := pub.PublishConnection(ctx, mine, details); !kerrors.IsAlreadyExists(err) || !strings.Contains(err.Error(), "cannot change to") {
			t.Errorf("publishing over its own Opaque Secret = %v; want the create's AlreadyExists, saying the type cannot change", err)
		}
		got := &corev1.Secret{}
		if err := plain.Get(ctx, client.ObjectKeyFromObject(legacy), got); err != nil {
			t.Fatal(err)
		}
		if len(got.Data) != 1 || string(got.Data["a"]) != "b" || got.Labels[writes.LabelManagedBy] != "" {
			t.Errorf("the Opaque Secret was written into: %q, labels %v", got.Data, got.Labels)
		}
	})
	t.Run("UnlabelledSecretOfAnotherIsRefused", func(t *testing.T) {
		theirs := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "their-conn", OwnerReferences: []metav1.OwnerReference{{APIVersion: "example.org/v1", Kind: "Other", Name: "x", UID: "another-uid", Controller: ptr.To(true)}}},
			Type:       resource.SecretTypeConnection,
			Data:       map[string][]byte{"password": []byte("theirs")},
		}
		if err := plain.Create(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		mine := obj.DeepCopy()
		mine.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "their-conn"}
		if _, err := pub.PublishConnection(ctx, mine, details); err == nil || !strings.Contains(err.Error(), "existing secret is not controlled by UID") {
			t.Errorf("publishing over another resource's connection Secret = %v; want crossplane-runtime's refusal", err)
		}
		got := &corev1.Secret{}
		if err := plain.Get(ctx, client.ObjectKeyFromObject(theirs), got); err != nil {
			t.Fatal(err)
		}
		if string(got.Data["password"]) != "theirs" || len(got.Data) != 1 || got.Labels[writes.LabelManagedBy] != "" {
			t.Errorf("another resource's Secret was changed: %q, labels %v", got.Data, got.Labels)
		}
	})
}
