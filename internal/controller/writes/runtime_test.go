package writes

// These tests pin what the Client relies on in crossplane-runtime's managed
// reconciler (v2.4.0). Each one names the behaviour; when a runtime upgrade
// changes it, the test fails by that name, and the Client must be looked at
// again before the upgrade lands.

import (
	"context"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// call is one request the reconciler sent, as the fake API server saw it.
type call struct {
	verb string // get, create, update, status-update, patch, status-patch
	kind string // Go type of the object
	// noOptions is whether the call was made without options.
	noOptions bool
	// patchType is the patch's type, for patches.
	patchType types.PatchType
	// annotations are the object's annotations as sent, for updates.
	annotations map[string]string
	// before is the annotations the server held before an update.
	before map[string]string
	// secretType is the type of a Secret created or patched.
	secretType corev1.SecretType
	// created is set on calls made after the external client's Create.
	created bool
}

// recorder is a fake API server that records every call.
type recorder struct {
	mu      sync.Mutex
	calls   []call
	created bool
}

func (r *recorder) add(c call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.created = r.created
	r.calls = append(r.calls, c)
}

func (r *recorder) all() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// kindOf is o's kind: the name of its Go type.
func kindOf(o runtime.Object) string { return reflect.TypeOf(o).Elem().Name() }

func testScheme(t *testing.T) *runtime.Scheme { return testenv.Scheme(t) }

// fakeManager is just enough of a manager for managed.NewReconciler.
type fakeManager struct {
	manager.Manager
	client client.Client
	scheme *runtime.Scheme
}

func (m fakeManager) GetClient() client.Client   { return m.client }
func (m fakeManager) GetScheme() *runtime.Scheme { return m.scheme }

// reconcileOnce runs crossplane-runtime's managed reconciler once over a
// new KVMProxy with an external client whose Observe finds nothing until
// Create ran, and returns what it sent.
func reconcileOnce(t *testing.T, details managed.ConnectionDetails) (*recorder, client.Client, *nsproxy.KVMProxy) {
	t.Helper()
	s := testScheme(t)
	mr := &nsproxy.KVMProxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p", UID: "uid-1"},
		Spec: nsproxy.KVMProxySpec{
			ManagedResourceSpec: xpv2.ManagedResourceSpec{WriteConnectionSecretToReference: &xpv2.LocalSecretReference{Name: "p-conn"}},
			ForProvider:         spec.KVMProxyParameters{Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.0.0.0/8"}}},
		},
	}
	rec := &recorder{}
	server := fake.NewClientBuilder().WithScheme(s).WithObjects(mr).WithStatusSubresource(mr).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				rec.add(call{verb: "get", kind: kindOf(obj), noOptions: len(opts) == 0})
				return c.Get(ctx, key, obj, opts...)
			},
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				cl := call{verb: "create", kind: kindOf(obj), noOptions: len(opts) == 0}
				if sec, ok := obj.(*corev1.Secret); ok {
					cl.secretType = sec.Type
				}
				rec.add(cl)
				return c.Create(ctx, obj, opts...)
			},
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				cur := obj.DeepCopyObject().(client.Object) //nolint:forcetypeassert // A copy of an object.
				_ = c.Get(ctx, client.ObjectKeyFromObject(obj), cur)
				rec.add(call{verb: "update", kind: kindOf(obj), noOptions: len(opts) == 0, annotations: obj.GetAnnotations(), before: cur.GetAnnotations()})
				return c.Update(ctx, obj, opts...)
			},
			Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				cl := call{verb: "patch", kind: kindOf(obj), noOptions: len(opts) == 0, patchType: patch.Type()}
				if sec, ok := obj.(*corev1.Secret); ok {
					cl.secretType = sec.Type
				}
				rec.add(cl)
				return c.Patch(ctx, obj, patch, opts...)
			},
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				rec.add(call{verb: sub + "-update", kind: kindOf(obj), noOptions: len(opts) == 0})
				return c.Status().Update(ctx, obj, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				rec.add(call{verb: sub + "-patch", kind: kindOf(obj), noOptions: len(opts) == 0, patchType: patch.Type()})
				return c.Status().Patch(ctx, obj, patch, opts...)
			},
		}).Build()

	exists := false
	ext := managed.ExternalClientFns{
		ObserveFn: func(context.Context, resource.Managed) (managed.ExternalObservation, error) {
			if !exists {
				return managed.ExternalObservation{}, nil
			}
			return managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true, ConnectionDetails: details}, nil
		},
		CreateFn: func(context.Context, resource.Managed) (managed.ExternalCreation, error) {
			exists = true
			rec.mu.Lock()
			rec.created = true
			rec.mu.Unlock()
			return managed.ExternalCreation{ConnectionDetails: details}, nil
		},
		UpdateFn: func(context.Context, resource.Managed) (managed.ExternalUpdate, error) {
			return managed.ExternalUpdate{}, nil
		},
		DeleteFn: func(context.Context, resource.Managed) (managed.ExternalDelete, error) {
			return managed.ExternalDelete{}, nil
		},
		DisconnectFn: func(context.Context) error { return nil },
	}
	r := managed.NewReconciler(fakeManager{client: server, scheme: s}, resource.ManagedKind(nsproxy.KVMProxyGroupVersionKind),
		managed.WithExternalConnector(managed.ExternalConnectorFn(func(context.Context, resource.Managed) (managed.ExternalClient, error) {
			return ext, nil
		})),
		managed.WithDeterministicExternalName(true),
		managed.WithCreationGracePeriod(0),
	)
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team-a", Name: "p"}}
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	// A second reconcile observes the instance and publishes its details.
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatalf("second Reconcile: %v", err)
	}
	return rec, server, mr
}

// The Client reaches the reconciler only through the manager's GetClient
// (Client.Manager): the reconciler, its finalizer, initializer, critical
// annotation updater and connection publisher must all write through it.
func TestRuntimeWritesThroughTheManagersClient(t *testing.T) {
	rec, _, _ := reconcileOnce(t, managed.ConnectionDetails{"url": []byte("http://10.0.0.1:3128")})
	verbs := map[string]bool{}
	for _, c := range rec.all() {
		verbs[c.kind+" "+c.verb] = true
	}
	for _, want := range []string{"KVMProxy get", "KVMProxy update", "KVMProxy status-update", "Secret create"} {
		if !verbs[want] {
			t.Errorf("the managed reconciler sent no %q through the manager's client; it sent %v", want, verbs)
		}
	}
}

// Client.Update leaves out an update whose only change is the
// external-create-pending annotation: the runtime must write it with a
// plain Update (no options) just before Create, changing nothing else.
func TestRuntimeWritesThePendingAnnotationAloneBeforeCreate(t *testing.T) {
	rec, _, _ := reconcileOnce(t, nil)
	found := false
	for _, c := range rec.all() {
		if c.verb != "update" || c.kind != "KVMProxy" || c.created {
			continue
		}
		if _, pending := c.annotations[meta.AnnotationKeyExternalCreatePending]; !pending {
			continue
		}
		if _, had := c.before[meta.AnnotationKeyExternalCreatePending]; had {
			continue
		}
		found = true
		if !c.noOptions {
			t.Error("the pending-annotation update was sent with options; Client.Update only leaves out updates without options")
		}
		added := map[string]string{}
		for k, v := range c.annotations {
			if c.before[k] != v {
				added[k] = v
			}
		}
		delete(added, meta.AnnotationKeyExternalCreatePending)
		if len(added) != 0 {
			t.Errorf("the pending-annotation update also changed %v", added)
		}
	}
	if !found {
		t.Error("the runtime sent no update adding the external-create-pending annotation before Create")
	}
}

// Client.Status().Update leaves out unchanged statuses only when called
// without options: the runtime must write status that way.
func TestRuntimeUpdatesStatusWithoutOptions(t *testing.T) {
	rec, _, _ := reconcileOnce(t, nil)
	n := 0
	for _, c := range rec.all() {
		if c.verb == "status-update" {
			n++
			if !c.noOptions {
				t.Error("the runtime updated status with options")
			}
		}
	}
	if n == 0 {
		t.Error("the runtime never updated status through Status().Update")
	}
}

// connectionSecrets recognises the runtime's connection Secrets by their
// type, and emptyPatch reads the runtime's patch as a merge patch of the
// whole Secret: the publisher must create Secrets of that type and patch
// them with a merge patch.
func TestRuntimePublishesConnectionSecretsByCreateAndMergePatch(t *testing.T) {
	rec, server, mr := reconcileOnce(t, managed.ConnectionDetails{"url": []byte("http://10.0.0.1:3128")})
	var created bool
	for _, c := range rec.all() {
		if c.kind == "Secret" && c.verb == "create" {
			created = true
			if c.secretType != resource.SecretTypeConnection {
				t.Errorf("the runtime created a connection Secret of type %q, want %q", c.secretType, resource.SecretTypeConnection)
			}
		}
	}
	if !created {
		t.Fatal("the runtime created no connection Secret")
	}
	// Changed details: the existing Secret is patched.
	pub := managed.NewAPILocalSecretPublisher(server, server.Scheme())
	got := &nsproxy.KVMProxy{}
	if err := server.Get(context.Background(), client.ObjectKeyFromObject(mr), got); err != nil {
		t.Fatal(err)
	}
	before := len(rec.all())
	if _, err := pub.PublishConnection(context.Background(), got, managed.ConnectionDetails{"url": []byte("http://10.0.0.2:3128")}); err != nil {
		t.Fatal(err)
	}
	var patched bool
	for _, c := range rec.all()[before:] {
		if c.kind == "Secret" && c.verb == "patch" {
			patched = true
			if c.patchType != types.MergePatchType {
				t.Errorf("the runtime patched a connection Secret with a %q patch, want a merge patch", c.patchType)
			}
		}
	}
	if !patched {
		t.Error("the runtime's publisher did not patch an existing connection Secret")
	}
}
