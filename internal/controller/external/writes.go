package external

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// SavingClient is the client the managed reconciler reads and writes
// managed resources with. It leaves out writes that would change nothing
// the API server does not already hold, which is most of them once a
// thousand resources are converging:
//
//   - a status update whose status equals the status the server holds at
//     the object's resourceVersion (a reconcile that changed no condition
//     and no observation);
//   - an update whose only change is the crossplane.io/external-create-
//     pending annotation. crossplane-runtime writes it just before Create,
//     so that a crash during Create leaves a trace, and it only stops on
//     such a trace when external names are not deterministic. Ours are
//     (InstanceName; Create adopts an instance carrying its own mark), so
//     the write buys nothing. The annotation still lands: it is written
//     with external-create-succeeded (or -failed) right after Create.
//
// What the server holds is known from what this client read or wrote: a
// resourceVersion names exactly one state of an object, so an object at
// the version last seen, with the same content, needs no write. Anything
// else is sent as it is (a stale version then fails with a conflict, as
// it would have).
//
// It also serves crossplane-runtime's connection publisher from a watch of
// connection Secrets (see connectionSecrets), when given one.
type SavingClient struct {
	client.Client

	secrets *connectionSecrets

	mu   sync.Mutex
	seen map[string]seenState // by Go type, namespace and name
}

// seenState is the last known server state of one object.
type seenState struct {
	version        string
	object, status [sha256.Size]byte // without managed fields, resourceVersion and the pending annotation; the status alone
	// wrote is set when the state is the response to this client's own
	// write: a read from the cache may then still be older.
	wrote bool
}

// NewSavingClient wraps c. secretCache, when not nil, is a reader of
// the cluster's connection Secrets (ConnectionSecretCache); synced, when
// not nil, reports whether it has synced (reads go to the API server
// until then).
func NewSavingClient(c client.Client, secretCache client.Reader, synced func() bool) *SavingClient {
	sc := &SavingClient{Client: c, seen: map[string]seenState{}}
	if secretCache != nil {
		sc.secrets = &connectionSecrets{cache: secretCache, synced: synced, created: map[types.NamespacedName]time.Time{}}
	}
	return sc
}

func seenKey(obj client.Object) string {
	return fmt.Sprintf("%T/%s/%s", obj, obj.GetNamespace(), obj.GetName())
}

// digests returns the digest of obj without its status, managed fields,
// resourceVersion and pending annotation, and the digest of its status.
func digests(obj client.Object) (object, status [sha256.Size]byte, err error) {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return object, status, err
	}
	st, err := json.Marshal(u["status"])
	if err != nil {
		return object, status, err
	}
	delete(u, "status")
	if md, ok := u["metadata"].(map[string]any); ok {
		delete(md, "managedFields")
		delete(md, "resourceVersion")
		if a, ok := md["annotations"].(map[string]any); ok {
			delete(a, meta.AnnotationKeyExternalCreatePending)
			if len(a) == 0 {
				delete(md, "annotations")
			}
		}
	}
	ob, err := json.Marshal(u)
	if err != nil {
		return object, status, err
	}
	return sha256.Sum256(ob), sha256.Sum256(st), nil
}

// record notes obj as the server's state at its resourceVersion; wrote
// says it is the response to this client's write. A read older than a
// state this client wrote is not noted.
func (c *SavingClient) record(obj client.Object, wrote bool) {
	o, s, err := digests(obj)
	c.mu.Lock()
	defer c.mu.Unlock()
	key := seenKey(obj)
	if err != nil || obj.GetResourceVersion() == "" {
		delete(c.seen, key)
		return
	}
	if prev, ok := c.seen[key]; ok && !wrote && prev.wrote && older(obj.GetResourceVersion(), prev.version) {
		return
	}
	c.seen[key] = seenState{version: obj.GetResourceVersion(), object: o, status: s, wrote: wrote}
}

// older reports whether resourceVersion a is older than b. Versions are
// opaque to clients, but every API server numbers them from etcd's
// revision; anything that does not parse is never called older.
func older(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA == nil && errB == nil && x < y
}

// unchanged reports whether the server already holds obj: its object
// (status left out) when status is false, its status when true. obj may
// be at the last version seen, or older than a version this client wrote
// (read from a cache that has not caught up): a write of the same content
// from there would only fail with a conflict.
func (c *SavingClient) unchanged(obj client.Object, status bool) bool {
	c.mu.Lock()
	s, ok := c.seen[seenKey(obj)]
	c.mu.Unlock()
	if !ok || s.version == "" {
		return false
	}
	if v := obj.GetResourceVersion(); v != s.version && !(s.wrote && older(v, s.version)) {
		return false
	}
	o, st, err := digests(obj)
	if err != nil {
		return false
	}
	if status {
		return st == s.status
	}
	return o == s.object
}

// Get implements client.Reader, noting what it read.
func (c *SavingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Secret); ok && c.secrets != nil {
		return c.secrets.get(ctx, c.Client, key, obj, opts...)
	}
	err := c.Client.Get(ctx, key, obj, opts...)
	switch {
	case err == nil:
		c.record(obj, false)
	case kerrors.IsNotFound(err):
		// Gone: forget it.
		c.mu.Lock()
		delete(c.seen, fmt.Sprintf("%T/%s/%s", obj, key.Namespace, key.Name))
		c.mu.Unlock()
	}
	return err
}

// Create implements client.Writer; an empty connection Secret is not
// created.
func (c *SavingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if c.secrets != nil && c.secrets.empty(obj) {
		return nil
	}
	if err := c.Client.Create(ctx, obj, opts...); err != nil {
		return err
	}
	if _, ok := isConnectionSecret(obj); ok && c.secrets != nil {
		c.secrets.noteCreated(obj)
	}
	return nil
}

// Patch implements client.Writer; a patch emptying a connection Secret is
// not sent.
func (c *SavingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if c.secrets != nil && c.secrets.emptyPatch(obj, patch) {
		return nil
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

// Update implements client.Writer; an update changing nothing but the
// pending annotation is not sent.
func (c *SavingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if len(opts) == 0 && c.unchanged(obj, false) {
		return nil
	}
	if err := c.Client.Update(ctx, obj, opts...); err != nil {
		return err
	}
	c.record(obj, true)
	return nil
}

// Status returns the status writer that leaves out unchanged statuses.
func (c *SavingClient) Status() client.SubResourceWriter {
	return savingStatusWriter{SubResourceWriter: c.Client.Status(), c: c}
}

type savingStatusWriter struct {
	client.SubResourceWriter
	c *SavingClient
}

func (w savingStatusWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if len(opts) == 0 && w.c.unchanged(obj, true) {
		return nil
	}
	if err := w.SubResourceWriter.Update(ctx, obj, opts...); err != nil {
		return err
	}
	w.c.record(obj, true)
	return nil
}

func (w savingStatusWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := w.SubResourceWriter.Patch(ctx, obj, patch, opts...); err != nil {
		return err
	}
	w.c.record(obj, true)
	return nil
}

// savingManager is the manager as the managed reconciler sees it: the same,
// but with the SavingClient (the reconciler takes its client from the
// manager and has no option to set it).
type savingManager struct {
	manager.Manager
	client *SavingClient
}

func (m savingManager) GetClient() client.Client { return m.client }

// ReconcilerManager is mgr as crossplane-runtime's reconcilers should see
// it: with the shared SavingClient as its client.
func (sh *Shared) ReconcilerManager(mgr manager.Manager) manager.Manager {
	return savingManager{Manager: mgr, client: sh.Client}
}

// annotationUpdater is crossplane-runtime's retrying critical-annotation
// updater, except that the observation Create recorded survives it. The
// update's response carries the server's status, which would replace what
// Create observed; kept, it is saved by the status write that follows
// Create, in the same request as the conditions.
type annotationUpdater struct {
	inner managed.CriticalAnnotationUpdater
}

func (u annotationUpdater) UpdateCriticalAnnotations(ctx context.Context, o client.Object) error {
	r, ok := o.(interface{ Observation() *spec.ProxyObservation })
	if !ok {
		return u.inner.UpdateCriticalAnnotations(ctx, o)
	}
	keep := r.Observation().DeepCopy()
	err := u.inner.UpdateCriticalAnnotations(ctx, o)
	*r.Observation() = *keep
	return err
}
