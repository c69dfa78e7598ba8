package controller

import (
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/customresourcesgate"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/apis"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/controller/events"
)

// Scheme knows what the provider reads and writes: Kubernetes' kinds, the
// provider's own, and CustomResourceDefinitions (the safe-start gate).
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apis.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// ManagerOptions are the manager options the controllers are built for,
// with scheme s and a full resync every sync: the ones cmd/provider runs
// with and the integration tests' harness (internal/devenv/testenv/providerenv)
// starts the controllers with. The caller adds what is the process's own
// (leader election, metrics and probe addresses).
func ManagerOptions(s *runtime.Scheme, sync time.Duration) ctrl.Options {
	return ctrl.Options{
		Scheme: s,
		Client: client.Options{Cache: &client.CacheOptions{
			// Secrets are read uncached (credentials on every Connect), so
			// the provider never watches every Secret of the cluster.
			DisableFor: []client.Object{&corev1.Secret{}},
		}},
		Cache: cache.Options{
			SyncPeriod: &sync,
			ByObject:   cacheByObject(),
			// Nothing reads managed fields; without them a thousand
			// resources take a fraction of the memory.
			DefaultTransform: cache.TransformStripManagedFields(),
		},
		// Events are queued and sent at a bounded rate, none dropped
		// while the queue has room (package events); the caller adds it
		// to the manager, which stops it.
		EventBroadcaster: events.New(), //nolint:staticcheck // The only way to give the manager's recorders another broadcaster.
	}
}

// AddEventBroadcaster adds the event broadcaster of mo (ManagerOptions) to
// mgr, which then stops it when it stops.
func AddEventBroadcaster(mgr ctrl.Manager, mo ctrl.Options) error {
	if b := EventBroadcaster(mo); b != nil {
		return mgr.Add(b)
	}
	return nil
}

// EventBroadcaster is the event broadcaster of mo (ManagerOptions), for
// external.Options.Events; nil when mo has another.
func EventBroadcaster(mo ctrl.Options) *events.Broadcaster {
	b, _ := mo.EventBroadcaster.(*events.Broadcaster) //nolint:staticcheck // As in ManagerOptions.
	return b
}

// cacheByObject configures the manager's cache per type.
func cacheByObject() map[client.Object]cache.ByObject {
	// The PodProxy driver reads its Deployments, pods and Services through
	// the cache: only those carrying its label are cached, pods without
	// their spec.
	m := kubernetes.CacheByObject()
	// The safe-start gate needs only names and conditions of CRDs.
	m[&apiextensionsv1.CustomResourceDefinition{}] = cache.ByObject{Transform: customresourcesgate.TransformStripCRDSchema}
	// Usages are counted (by their labels) and checked against their
	// config and controller when tracked; nothing reads which resource
	// one names from the cache (the tracker writes it whole).
	m[&nsv1alpha1.ProviderConfigUsage{}] = cache.ByObject{Transform: StripUsage}
	m[&clusterv1alpha1.ProviderConfigUsage{}] = cache.ByObject{Transform: StripUsage}
	return m
}

// StripUsage is the cache transform of ProviderConfigUsages: without
// managed fields, annotations and the resource reference.
func StripUsage(o any) (any, error) {
	u, ok := o.(interface {
		metav1.Object
		SetResourceReference(xpv2.TypedReference)
	})
	if !ok {
		return o, nil
	}
	u.SetManagedFields(nil)
	u.SetAnnotations(nil)
	u.SetResourceReference(xpv2.TypedReference{})
	return o, nil
}
