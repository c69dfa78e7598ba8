package writes

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ConnectionSecretCache is a cache of the cluster's connection Secrets
// (type connection.crossplane.io/v1alpha1), without managed fields. The
// manager's own cache holds no Secrets at all.
func ConnectionSecretCache(cfg *rest.Config, s *runtime.Scheme) (cache.Cache, error) {
	return cache.New(cfg, cache.Options{
		Scheme: s,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {
				Field:     fields.OneTermEqualSelector("type", string(resource.SecretTypeConnection)),
				Transform: cache.TransformStripManagedFields(),
			},
		},
	})
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
//     when), and details that become empty leave the last ones in place.
//
// So a proxy's connection Secret costs one request when it is first
// published and one per change, and nothing on the reconciles between.
type connectionSecrets struct {
	cache client.Reader
	// synced reports whether the watch has synced; until it has (or when
	// the provider may not list Secrets) reads go to the API server.
	synced func() bool

	mu      sync.Mutex
	created map[types.NamespacedName]time.Time
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
	err := cs.cache.Get(ctx, key, obj, opts...)
	if !kerrors.IsNotFound(err) {
		return err
	}
	cs.mu.Lock()
	at, recent := cs.created[key]
	if recent && time.Since(at) > createdWindow {
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

func (cs *connectionSecrets) noteCreated(obj client.Object) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	now := time.Now()
	for k, at := range cs.created {
		if now.Sub(at) > createdWindow {
			delete(cs.created, k)
		}
	}
	cs.created[client.ObjectKeyFromObject(obj)] = now
}
