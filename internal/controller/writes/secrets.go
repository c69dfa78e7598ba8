package writes

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The label the Client gives the connection Secrets it writes, by which
// the connection Secret cache watches this provider's alone.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "provider-egressproxy"
)

// ConnectionSecretCache is a cache of the connection Secrets (type
// connection.crossplane.io/v1alpha1) this provider wrote (LabelManagedBy),
// without managed fields and without their data: a cached Secret holds
// only the digest of its data (DataDigest), which is all the Client needs
// to tell whether the server already holds some details. So the provider
// keeps no copy of every proxy's credentials in memory, a connection
// Secret costs a digest rather than a dozen values, whatever the number
// of proxies, and the connection Secrets of other providers and
// composites never reach it. The manager's own cache holds no Secrets at
// all.
func ConnectionSecretCache(cfg *rest.Config, s *runtime.Scheme) (cache.Cache, error) {
	strip := cache.TransformStripManagedFields()
	return cache.New(cfg, cache.Options{
		Scheme: s,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {
				Label: labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy}),
				Field: fields.OneTermEqualSelector("type", string(resource.SecretTypeConnection)),
				Transform: func(o any) (any, error) {
					o, err := strip(o)
					if s, ok := o.(*corev1.Secret); ok && err == nil {
						digestOnly(s)
					}
					return o, err
				},
			},
		},
	})
}

// annotationDataDigest holds, on a Secret in the connection Secret cache
// only, the digest of the data it had; it is never written.
const annotationDataDigest = "egressproxy.io/cached-data-digest"

// annotationDataKeys holds, beside annotationDataDigest, the names of the
// keys the data had (no values), comma-separated: whether a key is there
// to remove.
const annotationDataKeys = "egressproxy.io/cached-data-keys"

// DataDigest is the digest of a Secret's data: its keys and values in
// key order, each length-prefixed.
func DataDigest(data map[string][]byte) string {
	keys := slices.Sorted(maps.Keys(data))
	h := sha256.New()
	for _, k := range keys {
		_ = binary.Write(h, binary.BigEndian, uint64(len(k)))
		h.Write([]byte(k))
		_ = binary.Write(h, binary.BigEndian, uint64(len(data[k])))
		h.Write(data[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// digestOnly replaces s's data with its digest (annotationDataDigest). It
// is idempotent, as an informer's transform must be: client-go may hand it
// an object it already transformed (a restart's initial list does), and a
// second transform must not make every connection Secret look changed and
// be written again.
func digestOnly(s *corev1.Secret) {
	if _, done := s.Annotations[annotationDataDigest]; done && len(s.Data) == 0 && len(s.StringData) == 0 {
		return
	}
	a := maps.Clone(s.Annotations)
	if a == nil {
		a = map[string]string{}
	}
	a[annotationDataDigest] = DataDigest(s.Data)
	a[annotationDataKeys] = strings.Join(slices.Sorted(maps.Keys(s.Data)), ",")
	s.Annotations, s.Data, s.StringData = a, nil, nil
}

// holdsAny reports whether s, read through the Client, holds any of keys.
func holdsAny(s *corev1.Secret, keys []string) bool {
	if _, cached := s.Annotations[annotationDataDigest]; cached {
		held := strings.Split(s.Annotations[annotationDataKeys], ",")
		return slices.ContainsFunc(keys, func(k string) bool { return slices.Contains(held, k) })
	}
	return slices.ContainsFunc(keys, func(k string) bool { _, ok := s.Data[k]; return ok })
}

// removals are the keys of data that have no value: details naming a key
// without a value remove it from the Secret (a merge patch's null), and
// no Secret is made for them.
func removals(data map[string][]byte) (keys []string, only bool) {
	for k, v := range data {
		if v == nil {
			keys = append(keys, k)
		}
	}
	return keys, len(keys) > 0 && len(keys) == len(data)
}

// withoutRemovals drops from s's data the keys without a value
// (removals), in a copy: the data is the caller's details.
func withoutRemovals(s *corev1.Secret) {
	if gone, _ := removals(s.Data); len(gone) > 0 {
		s.Data = maps.Clone(s.Data)
		maps.DeleteFunc(s.Data, func(_ string, v []byte) bool { return v == nil })
	}
}

// HeldData reports whether s, read through the Client, holds exactly data:
// by the digest the connection Secret cache kept, or by its own data when
// it was read from the API server.
func HeldData(s *corev1.Secret, data map[string][]byte) bool {
	d, ok := s.Annotations[annotationDataDigest]
	if !ok {
		d = DataDigest(s.Data)
	}
	return d == DataDigest(data)
}

// connectionSecrets is how the Client serves crossplane-runtime's
// connection publisher, which otherwise reads the Secret from the API
// server on every reconcile and writes one even when there is nothing to
// put in it:
//
//   - reads come from the watch of connection Secrets; a miss is trusted,
//     except for a Secret this client created a moment ago that the watch
//     has not delivered yet, which is read from the API server;
//   - a connection Secret with no data is neither created nor patched: it
//     appears when the instance has an address (the Ready condition says
//     when), and details that become empty leave the last ones in place;
//   - a patch of a connection Secret whose data the watch holds already
//     (by its digest), controlled by the same resource, is not sent.
//
// So a proxy's connection Secret costs one request when it is first
// published and one per change, and nothing on the reconciles between.
type connectionSecrets struct {
	cache client.Reader
	// synced reports whether the watch has synced; until it has (or when
	// the provider may not list Secrets) reads go to the API server.
	synced func() bool

	// now is the clock (time.Now unless a test sets it).
	now func() time.Time

	mu      sync.Mutex
	created map[types.NamespacedName]time.Time
	// prunedAt is when created was last rid of what is older than
	// createdWindow (Unix nanoseconds; read without mu on every get).
	prunedAt atomic.Int64
}

// createdWindow is how long after creating a Secret a miss in the watch is
// confirmed with a read from the API server.
const createdWindow = time.Minute

func isConnectionSecret(obj client.Object) (*corev1.Secret, bool) {
	s, ok := obj.(*corev1.Secret)
	return s, ok && s.Type == resource.SecretTypeConnection
}

// get reads a Secret; live is the API server.
func (cs *connectionSecrets) get(ctx context.Context, live client.Reader, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if cs.synced != nil && !cs.synced() {
		return live.Get(ctx, key, obj, opts...)
	}
	cs.prune()
	err := cs.cache.Get(ctx, key, obj, opts...)
	if !kerrors.IsNotFound(err) {
		return err
	}
	cs.mu.Lock()
	at, recent := cs.created[key]
	if recent && cs.now().Sub(at) > createdWindow {
		delete(cs.created, key)
		recent = false
	}
	cs.mu.Unlock()
	if !recent {
		return err
	}
	return live.Get(ctx, key, obj, opts...)
}

// empty reports whether obj is a connection Secret with nothing in it.
func (cs *connectionSecrets) empty(obj client.Object) bool {
	s, ok := isConnectionSecret(obj)
	return ok && len(s.Data) == 0 && len(s.StringData) == 0
}

// emptyPatch reports whether patch would write a connection Secret with no
// data (crossplane-runtime's publisher patches with the whole Secret).
func (cs *connectionSecrets) emptyPatch(obj client.Object, patch client.Patch) bool {
	if _, ok := obj.(*corev1.Secret); !ok || patch.Type() != types.MergePatchType {
		return false
	}
	b, err := patch.Data(obj)
	if err != nil {
		return false
	}
	s := &corev1.Secret{}
	if err := json.Unmarshal(b, s); err != nil {
		return false
	}
	return cs.empty(s)
}

// heldPatch reports whether patch, of a connection Secret, writes data the
// watch already holds for it, controlled by the same resource
// (crossplane-runtime's publisher patches with the whole Secret).
func (cs *connectionSecrets) heldPatch(ctx context.Context, obj client.Object, patch client.Patch) bool {
	if _, ok := obj.(*corev1.Secret); !ok || patch.Type() != types.MergePatchType || (cs.synced != nil && !cs.synced()) {
		return false
	}
	b, err := patch.Data(obj)
	if err != nil {
		return false
	}
	want := &corev1.Secret{}
	if err := json.Unmarshal(b, want); err != nil || len(want.StringData) > 0 || want.Type != resource.SecretTypeConnection {
		return false
	}
	cur := &corev1.Secret{}
	if err := cs.cache.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		return false
	}
	wc, cc := metav1.GetControllerOf(want), metav1.GetControllerOf(cur)
	if gone, only := removals(want.Data); only {
		// Keys to remove: held when none is there.
		return wc != nil && cc != nil && wc.UID == cc.UID && !holdsAny(cur, gone)
	}
	return wc != nil && cc != nil && wc.UID == cc.UID && HeldData(cur, want.Data)
}

// markOwn gives obj, a connection Secret about to be created, the label
// by which the watch holds it.
func markOwn(obj client.Object) {
	if obj.GetLabels()[LabelManagedBy] == ManagedBy {
		return
	}
	l := maps.Clone(obj.GetLabels())
	if l == nil {
		l = map[string]string{}
	}
	l[LabelManagedBy] = ManagedBy
	obj.SetLabels(l)
}

// labelled is patch, a merge patch of the connection Secret obj, that
// also gives it the label by which the watch holds it.
func labelled(obj client.Object, patch client.Patch) client.Patch {
	if _, ok := isConnectionSecret(obj); !ok {
		return patch
	}
	return editMerge(obj, patch, func(p map[string]any) bool {
		md, _ := p["metadata"].(map[string]any)
		if md == nil {
			md = map[string]any{}
			p["metadata"] = md
		}
		ls, _ := md["labels"].(map[string]any)
		if ls == nil {
			ls = map[string]any{}
			md["labels"] = ls
		}
		ls[LabelManagedBy] = ManagedBy
		return true
	})
}

// adopt writes the data of obj, a connection Secret whose create found
// one of its name, into that one, with the label, when crossplane-runtime
// would have written it (ConnectionSecretMustBeControllableBy: controlled
// by the same resource, or a connection Secret without a controller, which
// it then takes): one this provider wrote before it labelled its own (or
// under --all-writes), or one left without its owner, which the watch
// does not hold. Of the keys there, those of keys (the provider's own)
// that obj leaves out go, as in a patch (withoutStaleKeys). Otherwise it
// returns the runtime's refusal, or exists, the create's error.
func adopt(ctx context.Context, live client.Client, obj client.Object, keys []string, exists error) error {
	want, ok := isConnectionSecret(obj)
	cur := &corev1.Secret{}
	if !ok || live.Get(ctx, client.ObjectKeyFromObject(obj), cur) != nil {
		return exists
	}
	wc := metav1.GetControllerOf(want)
	if wc == nil {
		return exists
	}
	if err := resource.ConnectionSecretMustBeControllableBy(wc.UID)(ctx, cur, want); err != nil {
		return err
	}
	if cur.Type != resource.SecretTypeConnection {
		// A legacy Secret of the resource's: the runtime's patch would
		// change its type, which the API server refuses.
		return errors.Wrapf(exists, "connection Secret %s is of type %q, which cannot change to %q: delete it, and it is written anew", client.ObjectKeyFromObject(cur), cur.Type, resource.SecretTypeConnection)
	}
	orig := cur.DeepCopy()
	markOwn(cur)
	if metav1.GetControllerOf(cur) == nil {
		cur.OwnerReferences = want.OwnerReferences
	}
	data := maps.Clone(cur.Data)
	if data == nil {
		data = map[string][]byte{}
	}
	for _, k := range keys {
		delete(data, k)
	}
	maps.Copy(data, want.Data)
	cur.Data = data
	if err := live.Patch(ctx, cur, client.MergeFrom(orig)); err != nil {
		return secretRefusal(obj, err)
	}
	cur.DeepCopyInto(want)
	return nil
}

func (cs *connectionSecrets) noteCreated(obj client.Object) {
	cs.prune()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.created[client.ObjectKeyFromObject(obj)] = cs.now()
}

// prune forgets the creations older than createdWindow, at most every
// half window (on every create a burst of creates would be quadratic),
// and on reads too, so that what a burst of creates noted does not stay
// in memory once the creates stop. A map emptied is made anew: Go's maps
// do not shrink.
func (cs *connectionSecrets) prune() {
	now := cs.now()
	if now.UnixNano()-cs.prunedAt.Load() < int64(createdWindow/2) {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.prunedAt.Store(now.UnixNano())
	for k, at := range cs.created {
		if now.Sub(at) > createdWindow {
			delete(cs.created, k)
		}
	}
	if len(cs.created) == 0 {
		cs.created = map[types.NamespacedName]time.Time{}
	}
}

// secretRefusal is err, a failed write of obj, without the API server's
// message when obj is a connection Secret (WithoutAnswerText), naming the
// Secret.
func secretRefusal(obj client.Object, err error) error {
	if _, ok := isConnectionSecret(obj); !ok {
		return err
	}
	var status kerrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		return err
	}
	return &refusedSecretError{what: "connection Secret " + client.ObjectKeyFromObject(obj).String() + ": ", status: status.Status(), err: err}
}

// WithoutAnswerText is err, a failed write of a Secret, without the API
// server's message: a validation error or an admission webhook's denial
// may quote the Secret's data (a password, a key). What the answer was
// (status, reason, the fields refused) stays, and so does err for
// errors.As and kerrors. An error that is no API server's answer is
// returned as it is.
func WithoutAnswerText(err error) error {
	var status kerrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		return err
	}
	return &refusedSecretError{status: status.Status(), err: err}
}

type refusedSecretError struct {
	// what names the Secret, when the error's wrapper does not.
	what   string
	status metav1.Status
	err    error
}

func (e *refusedSecretError) Error() string {
	msg := fmt.Sprintf("%sthe API server answered %d %s (its message is not shown: it may quote the Secret's data)", e.what, e.status.Code, e.status.Reason)
	if e.status.Code == http.StatusForbidden && strings.Contains(e.status.Message, "exceeded quota") {
		// The quota plugin's words quote no data, and a tenant cannot read
		// the API server's log to tell a full quota from RBAC.
		msg += ": exceeded quota, a ResourceQuota of the namespace refused it"
	}
	if d := e.status.Details; d != nil {
		fields := make([]string, 0, len(d.Causes))
		for _, c := range d.Causes {
			if c.Field != "" && !slices.Contains(fields, c.Field) {
				fields = append(fields, c.Field)
			}
		}
		if len(fields) > 0 {
			msg += " for " + strings.Join(fields, ", ")
		}
	}
	return msg
}

func (e *refusedSecretError) Unwrap() error { return e.err }
