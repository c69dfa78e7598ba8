// Package writes gives crossplane-runtime's managed reconciler a client
// that leaves out the writes the API server already holds, and serves its
// connection publisher from a watch of connection Secrets.
//
// crossplane-runtime v2.4.0 takes the reconciler's client (and its
// finalizer's, initializer's and connection publisher's) from the manager
// and offers no option to set them, so the client reaches the reconciler
// through Manager, a view of the manager that returns it. What the client
// relies on in the runtime is pinned by runtime_test.go: a runtime upgrade
// that changes one of those behaviours fails a test by name.
package writes

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Client is the client the managed reconciler reads and writes
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
// the version last seen, with the same content, needs no write. So does an
// object at a version this client's own write replaced (read from a cache
// that has not caught up) whose content is what the client wrote: sent, it
// could only fail with a conflict. Versions are compared only for equality,
// as the API conventions say they are opaque. Anything else is sent as it
// is (a stale version then fails with a conflict, as it would have).
//
// It also serves crossplane-runtime's connection publisher from a watch of
// connection Secrets (see connectionSecrets), when given one.
type Client struct {
	client.Client

	secrets *connectionSecrets

	mu   sync.Mutex
	seen map[objectKey]seenState

	// catchUpEvery and catchUpFor are how often, and for how long at
	// most, Get reads an object again that it read at a version this
	// client's own write replaced (see catchUp).
	catchUpEvery, catchUpFor time.Duration

	// OnWrite, when set, is called after every write of an object this
	// client sends (the events wait while they go on: events.NoteWrite).
	OnWrite func()

	// ConnectionKeys are the keys of a connection Secret that are the
	// provider's: a patch of one removes those its data leaves out
	// (withoutStaleKeys).
	ConnectionKeys []string
}

// The defaults of Client.catchUpEvery and Client.catchUpFor.
const (
	catchUpEvery = 5 * time.Millisecond
	catchUpFor   = time.Second
)

// objectKey names an object by its Go type, namespace and name. Its
// strings are the object's own (no key is built per read).
type objectKey struct {
	t               reflect.Type
	namespace, name string
}

// seenState is the last known server state of one object.
type seenState struct {
	version        string
	object, status [sha256.Size]byte // without managed fields, resourceVersion and the pending annotation; the status alone
	// replaced are the versions this client's own writes replaced since
	// the object was last read at a version of its own: a read from the
	// cache may still return one of them.
	replaced []string
}

// maxReplaced bounds seenState.replaced: a cache lags a few writes at most.
const maxReplaced = 4

// NewClient wraps c. secretCache, when not nil, is a reader of
// the cluster's connection Secrets (ConnectionSecretCache); synced, when
// not nil, reports whether it has synced (reads go to the API server
// until then).
func NewClient(c client.Client, secretCache client.Reader, synced func() bool) *Client {
	sc := &Client{Client: c, seen: map[objectKey]seenState{}, catchUpEvery: catchUpEvery, catchUpFor: catchUpFor}
	if secretCache != nil {
		sc.secrets = &connectionSecrets{cache: secretCache, synced: synced, now: time.Now, created: map[types.NamespacedName]time.Time{}}
	}
	return sc
}

// noted reports whether the client notes obj: a managed resource, whose
// reconciles read and write it again until it is gone. Anything else
// read through the client (the config a finalizer records a release in,
// a Secret) may never be read again, and its entry would stay for ever.
func noted(obj client.Object) bool {
	_, ok := obj.(resource.Managed)
	return ok
}

func seenKey(obj client.Object) objectKey {
	return objectKey{t: reflect.TypeOf(obj), namespace: obj.GetNamespace(), name: obj.GetName()}
}

// digests returns the digest of obj without its status, managed fields,
// resourceVersion and pending annotation, and the digest of its status.
func digests(obj client.Object) (object, status [sha256.Size]byte, err error) {
	if status, err = statusDigest(obj); err != nil {
		return object, status, err
	}
	if b, ok, err := typedObjectJSON(obj); ok || err != nil {
		return sha256.Sum256(b), status, err
	}
	var u map[string]any
	if un, ok := obj.(runtime.Unstructured); ok {
		// The converter hands back an unstructured object's own content:
		// what is left out below must not be deleted from the caller's.
		u = runtime.DeepCopyJSON(un.UnstructuredContent())
	} else if u, err = runtime.DefaultUnstructuredConverter.ToUnstructured(obj); err != nil {
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
	return sha256.Sum256(ob), status, nil
}

// typedObjectJSON is obj as JSON without its type, status, managed
// fields, resourceVersion and pending annotation, for a typed object (a struct
// with ObjectMeta and Status fields; ok false otherwise): encoded from a
// shallow copy with those fields cleared, which costs a fraction of the
// unstructured conversion (digests runs on every read of a new version
// and every write). The caller's object is not changed.
func typedObjectJSON(obj client.Object) (b []byte, ok bool, err error) {
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil, false, nil
	}
	cp := reflect.New(v.Elem().Type()).Elem()
	cp.Set(v.Elem())
	st, om := cp.FieldByName("Status"), cp.FieldByName("ObjectMeta")
	if !st.IsValid() || !om.IsValid() || !st.CanSet() || om.Type() != reflect.TypeFor[metav1.ObjectMeta]() {
		return nil, false, nil
	}
	st.SetZero()
	// The type is the key's: a read from the cache sets it, a write's
	// response may not.
	if tm := cp.FieldByName("TypeMeta"); tm.IsValid() && tm.CanSet() {
		tm.SetZero()
	}
	m := om.Addr().Interface().(*metav1.ObjectMeta) //nolint:forcetypeassert // Its type was checked.
	m.ManagedFields, m.ResourceVersion = nil, ""
	if _, has := m.Annotations[meta.AnnotationKeyExternalCreatePending]; has {
		a := maps.Clone(m.Annotations)
		delete(a, meta.AnnotationKeyExternalCreatePending)
		if len(a) == 0 {
			a = nil
		}
		m.Annotations = a
	}
	if len(m.Annotations) == 0 {
		m.Annotations = nil
	}
	b, err = json.Marshal(cp.Addr().Interface())
	return b, true, err
}

// statusDigest is the digest of obj's status: its Status field as JSON
// (the status of an unstructured object), "null" when it has none. It
// encodes the status alone, not the whole object through the unstructured
// converter, because it runs on every status write the managed reconciler
// makes (one per reconcile): converting the whole object there would cost
// more than the rest of this client.
func statusDigest(obj client.Object) ([sha256.Size]byte, error) {
	var st any
	if u, ok := obj.(runtime.Unstructured); ok {
		st = u.UnstructuredContent()["status"]
	} else if v := reflect.Indirect(reflect.ValueOf(obj)); v.Kind() == reflect.Struct {
		if f := v.FieldByName("Status"); f.IsValid() {
			st = f.Interface()
		}
	}
	b, err := json.Marshal(st)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(b), nil
}

// read notes obj, just read, as the server's state at its
// resourceVersion, unless that is a version this client's own write
// replaced (a cache that has not caught up): the write's state stays. An
// object at the version already noted is that state: its digests are not
// computed again, since a steady resource is read at the same version on
// every reconcile.
func (c *Client) read(obj client.Object) {
	key := seenKey(obj)
	v := obj.GetResourceVersion()
	c.mu.Lock()
	prev, ok := c.seen[key]
	if ok && v != "" && prev.version == v {
		// Read at a version of its own: as the noted state, read now.
		prev.replaced = nil
		c.seen[key] = prev
	}
	c.mu.Unlock()
	if ok && v != "" && (prev.version == v || slices.Contains(prev.replaced, v)) {
		return
	}
	o, s, err := digests(obj)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || v == "" {
		delete(c.seen, key)
		return
	}
	if prev, ok := c.seen[key]; ok && slices.Contains(prev.replaced, v) {
		return
	}
	c.seen[key] = seenState{version: v, object: o, status: s}
}

// wrote notes obj, the response to this client's write of an object that
// was at version from, as the server's state.
func (c *Client) wrote(obj client.Object, from string) {
	if c.OnWrite != nil {
		c.OnWrite()
	}
	if !noted(obj) {
		return
	}
	o, s, err := digests(obj)
	c.mu.Lock()
	defer c.mu.Unlock()
	key := seenKey(obj)
	if err != nil || obj.GetResourceVersion() == "" {
		delete(c.seen, key)
		return
	}
	var replaced []string
	if prev, ok := c.seen[key]; ok {
		replaced = append(replaced, prev.replaced...)
	}
	if from != "" && !slices.Contains(replaced, from) {
		replaced = append(replaced, from)
	}
	if len(replaced) > maxReplaced {
		replaced = replaced[len(replaced)-maxReplaced:]
	}
	c.seen[key] = seenState{version: obj.GetResourceVersion(), object: o, status: s, replaced: replaced}
}

// unchanged reports whether the server already holds obj: its object
// (status left out) when status is false, its status when true. obj may
// be at the last version seen, or at a version this client's own write
// replaced (read from a cache that has not caught up): a write of the same
// content from there would only fail with a conflict.
func (c *Client) unchanged(obj client.Object, status bool) bool {
	c.mu.Lock()
	s, ok := c.seen[seenKey(obj)]
	c.mu.Unlock()
	if !ok || s.version == "" {
		return false
	}
	if v := obj.GetResourceVersion(); v != s.version && !slices.Contains(s.replaced, v) {
		return false
	}
	if status {
		st, err := statusDigest(obj)
		return err == nil && st == s.status
	}
	o, _, err := digests(obj)
	return err == nil && o == s.object
}

// CachesConnectionSecrets reports whether Get reads connection Secrets
// from a watch (no request to the API server).
func (c *Client) CachesConnectionSecrets() bool { return c.secrets != nil }

// Get implements client.Reader, noting what it read.
func (c *Client) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Secret); ok && c.secrets != nil {
		return c.secrets.get(ctx, c.Client, key, obj, opts...)
	}
	err := c.Client.Get(ctx, key, obj, opts...)
	if err == nil && c.behind(obj) {
		err = c.catchUp(ctx, key, obj, opts...)
	}
	switch {
	case err == nil && noted(obj):
		c.read(obj)
	case kerrors.IsNotFound(err):
		// Gone: forget it.
		c.mu.Lock()
		delete(c.seen, objectKey{t: reflect.TypeOf(obj), namespace: key.Namespace, name: key.Name})
		c.mu.Unlock()
	}
	return err
}

// behind reports whether obj, just read, is at a version this client's own
// write replaced: the reader (the manager's cache) has not received that
// write's watch event yet.
func (c *Client) behind(obj client.Object) bool {
	v := obj.GetResourceVersion()
	c.mu.Lock()
	s, ok := c.seen[seenKey(obj)]
	c.mu.Unlock()
	return ok && v != "" && v != s.version && slices.Contains(s.replaced, v)
}

// catchUp reads obj again, every c.catchUpEvery, until the reader holds it
// at a version this client's own write did not replace, or it is gone (or
// the read fails: that error is returned). A status computed from the
// stale read and written would be answered 409 Conflict and the resource
// retried through the controller's backoff (a second or more), which
// would delay its Ready well past its pod's.
//
// Only this client's own writes make it wait: a version in replaced is one
// the API server has moved past (the write that replaced it succeeded), so
// a cache that is receiving events moves past it too; and a read at the
// version the client wrote last clears replaced (read). A cache that never
// catches up (a stuck watch) costs c.catchUpFor at most: then, or when ctx
// is done, the last read is returned as before, and a write from it
// conflicts as it always did.
func (c *Client) catchUp(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	deadline := time.NewTimer(c.catchUpFor)
	defer deadline.Stop()
	tick := time.NewTicker(c.catchUpEvery)
	defer tick.Stop()
	for c.behind(obj) {
		select {
		case <-ctx.Done():
			return nil
		case <-deadline.C:
			return nil
		case <-tick.C:
		}
		if err := c.Client.Get(ctx, key, obj, opts...); err != nil {
			return err
		}
	}
	return nil
}

// Create implements client.Writer; an empty connection Secret is not
// created, and one created carries the label the watch selects.
func (c *Client) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if s, ok := isConnectionSecret(obj); ok {
		// Keys to remove from a Secret that is not there yet.
		withoutRemovals(s)
	}
	if c.secrets != nil && c.secrets.empty(obj) {
		return nil
	}
	_, conn := isConnectionSecret(obj)
	conn = conn && c.secrets != nil
	if conn {
		markOwn(obj)
	}
	// The API server's words go before adopt adds the provider's own.
	err := secretRefusal(obj, c.Client.Create(ctx, obj, opts...))
	if conn && kerrors.IsAlreadyExists(err) {
		err = adopt(ctx, c.Client, obj, c.ConnectionKeys, err)
	}
	if err != nil {
		return err
	}
	if conn {
		c.secrets.noteCreated(obj)
	}
	return nil
}

// Patch implements client.Writer; a patch emptying a connection Secret, or
// writing the data the watch holds for it, is not sent, and one that is
// sent removes the ConnectionKeys its data leaves out.
func (c *Client) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if c.secrets != nil && (c.secrets.emptyPatch(obj, patch) || c.secrets.heldPatch(ctx, obj, patch)) {
		return nil
	}
	patch = withoutStaleKeys(obj, patch, c.ConnectionKeys)
	if c.secrets != nil {
		patch = labelled(obj, patch)
	}
	return secretRefusal(obj, c.Client.Patch(ctx, obj, patch, opts...))
}

// Update implements client.Writer; an update changing nothing but the
// pending annotation is not sent.
func (c *Client) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if len(opts) == 0 && c.unchanged(obj, false) {
		return nil
	}
	from := obj.GetResourceVersion()
	if err := c.Client.Update(ctx, obj, opts...); err != nil {
		return err
	}
	c.wrote(obj, from)
	return nil
}

// Delete implements client.Writer, forgetting what it noted of obj once
// it is gone or going: an object deleted without finalizers is never read
// again, and its entry would stay for ever.
func (c *Client) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	err := c.Client.Delete(ctx, obj, opts...)
	if err == nil || kerrors.IsNotFound(err) {
		c.mu.Lock()
		delete(c.seen, seenKey(obj))
		c.mu.Unlock()
	}
	return err
}

// Status returns the status writer that leaves out unchanged statuses.
func (c *Client) Status() client.SubResourceWriter {
	return savingStatusWriter{SubResourceWriter: c.Client.Status(), c: c}
}

type savingStatusWriter struct {
	client.SubResourceWriter
	c *Client
}

func (w savingStatusWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if len(opts) == 0 && w.c.unchanged(obj, true) {
		return nil
	}
	from := obj.GetResourceVersion()
	if err := w.SubResourceWriter.Update(ctx, obj, opts...); err != nil {
		return err
	}
	w.c.wrote(obj, from)
	return nil
}

func (w savingStatusWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	from := obj.GetResourceVersion()
	if err := w.SubResourceWriter.Patch(ctx, obj, patch, opts...); err != nil {
		return err
	}
	w.c.wrote(obj, from)
	return nil
}

// view is a manager as crossplane-runtime's reconcilers see it through
// Manager: the same, except that GetClient returns the Client.
type view struct {
	manager.Manager
	client client.Client
}

func (m view) GetClient() client.Client { return m.client }

// Manager returns mgr as crossplane-runtime's reconcilers should see it:
// the same manager, except that GetClient returns c, so the reconciler,
// its finalizer, initializer and connection publisher write through c.
// Everything else (the scheme, the cache, the API reader) is mgr's own.
func (c *Client) Manager(mgr manager.Manager) manager.Manager {
	return view{Manager: mgr, client: c}
}
