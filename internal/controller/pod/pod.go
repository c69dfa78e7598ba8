// Package pod binds the PodProxy kind (both scopes) to the kubernetes
// backend.
package pod

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// uidIndex indexes PodProxies by UID in the manager's cache, so that an
// event on a pod (which carries the proxy's UID as a label) finds its
// managed resource with one cache lookup.
const uidIndex = "metadata.uid"

// Options are the PodProxy binding's seams for tests.
type Options struct {
	// DefaultImage is the Squid image of a kubernetes block that names
	// none; kubernetes.DefaultImage (the build's) when empty. The node
	// tests make it the image they built, so that the default path is the
	// one they run.
	DefaultImage string
	// Networks are this cluster's own networks as the provider already
	// discovers them (external.Options.ClusterNetworks): the PodProxies in
	// this cluster deny them without reading them a second time. Nil: the
	// drivers read them.
	Networks netguard.Networks
}

// binding is the PodProxy binding's state: drivers on the manager's cached
// client for this cluster and on pooled clients for remote ones, the
// background prober, and the watches' subscribers.
type binding struct {
	local    *kubernetes.Cluster
	localErr error
	remote   *kubernetes.Remote
	prober   *squid.Prober
	// image is Options.DefaultImage.
	image string
	// access holds whether this cluster lets the provider do what the
	// driver does here (nil when this cluster cannot be reached).
	access *access

	mu          sync.Mutex
	subscribers []chan event.GenericEvent
}

// New returns the PodProxy binding for mgr: its Connect builds drivers on
// the manager's cached client for this cluster, and on pooled clients for
// remote ones; its Watches make a pod's, Deployment's or Service's change
// reconcile the proxy at once.
func New(mgr ctrl.Manager, o Options) external.Kind[spec.PodProxyParameters] {
	b := &binding{remote: &kubernetes.Remote{Scheme: mgr.GetScheme()}, image: o.DefaultImage}
	b.prober = &squid.Prober{Notify: b.notify, Wait: probeWait}
	b.local, b.localErr = kubernetes.NewLocalCluster(mgr.GetConfig(), mgr.GetScheme(), mgr.GetCache())
	if b.local != nil {
		b.local.Networks = o.Networks
		if cs, err := authorizationv1.NewForConfig(mgr.GetConfig()); err == nil {
			b.access = &access{reviews: cs.SelfSubjectAccessReviews(), recheck: 30 * time.Second}
		}
	}
	return external.Kind[spec.PodProxyParameters]{
		Name:    "PodProxy",
		GVKs:    []schema.GroupVersionKind{nsproxy.PodProxyGroupVersionKind, clusterproxy.PodProxyGroupVersionKind},
		Proxy:   func(p *spec.PodProxyParameters) *spec.ProxySettings { return &p.Proxy },
		Request: request,
		Owned:   owned,
		Release: b.release,
		PublicListener: func(p *spec.PodProxyParameters) string {
			if p.Service != nil && p.Service.Type == string(corev1.ServiceTypeLoadBalancer) {
				return "a LoadBalancer Service (spec.forProvider.service.type)"
			}
			return ""
		},
		Watches: b.watches,
		Backend: external.Backend{Name: "kubernetes", Block: block, Connect: b.connect},
	}
}

// block is what the generic layer enforces of a kubernetes block.
func block(s *spec.ProviderConfigSpec) (external.Block, bool) {
	k := s.Kubernetes
	if k == nil {
		return external.Block{}, false
	}
	return external.Block{CredentialsSource: &k.Credentials.Source, EgressCheck: k.EgressCheck}, true
}

func request(_ *external.Config, p *spec.PodProxyParameters, req *proxy.Request) error {
	var e kubernetes.Exposure
	if p.Service != nil {
		e.ServiceType = p.Service.Type
	}
	if p.Replicas != nil {
		e.Replicas = *p.Replicas
	}
	if e != (kubernetes.Exposure{}) {
		req.Extension = e
	}
	return nil
}

// owned makes the PodProxy the owner of its Deployment where the garbage
// collector can honour that: in the provider's own cluster
// (InjectedIdentity; in another cluster the owner does not exist, and the
// collector would delete the Deployment at once), for a cluster-scoped
// PodProxy, or a namespaced one in the Deployment's own namespace (an
// owner in another namespace counts as absent, with the same result); and
// only for a resource whose deletion deletes its instance (never under
// deletionPolicy Orphan or management policies without Delete).
func owned(cfg *external.Config, mg resource.Managed, req *proxy.Request) {
	k := cfg.Spec.Kubernetes
	if k == nil || k.Credentials.Source != xpv2.CredentialsSourceInjectedIdentity || !external.Deletes(mg) {
		return
	}
	var gvk schema.GroupVersionKind
	switch mg.(type) {
	case *clusterproxy.PodProxy:
		gvk = clusterproxy.PodProxyGroupVersionKind
	case *nsproxy.PodProxy:
		if mg.GetNamespace() != k.Namespace {
			return
		}
		gvk = nsproxy.PodProxyGroupVersionKind
	default:
		return
	}
	e, _ := req.Extension.(kubernetes.Exposure)
	e.Owner = &kubernetes.Owner{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind, Name: mg.GetName(), UID: string(mg.GetUID())}
	req.Extension = e
}

// release removes the owner references naming mg from its Deployments in
// this cluster when mg's deletion leaves its instance (deletionPolicy
// Orphan, management policies without Delete), before mg's finalizer goes:
// owned sets them only for a resource that deletes its instance, at Create
// and Update, so a resource made with the default policies and changed to
// Observe (which never updates) keeps it, and the garbage collector would
// delete the Deployment, its pods, Secret and Service, the proxy the user
// asked to keep, once mg is gone. The Deployments are those the cache
// holds with mg's UID label. Where the provider may not do what PodProxies
// need here (no RBAC to list Deployments), it never made one, and nothing
// is read.
func (b *binding) release(ctx context.Context, kube client.Client, mg resource.Managed) error {
	if external.Deletes(mg) || mg.GetUID() == "" || b.local == nil {
		return nil
	}
	if b.access != nil {
		var missing *missingError
		if err := b.access.check(ctx); errors.As(err, &missing) {
			return nil
		} else if err != nil {
			return err
		}
	}
	return releaseDeployments(ctx, kube, mg)
}

// releaseDeployments removes the owner references carrying mg's UID from
// the Deployments labelled with it, each with a merge patch that holds the
// resourceVersion read (a Deployment changed since fails with a conflict,
// and the reconcile retries with a fresh read). A Deployment being deleted,
// or gone, is left as it is.
func releaseDeployments(ctx context.Context, kube client.Client, mg resource.Managed) error {
	uid := mg.GetUID()
	l := &appsv1.DeploymentList{}
	if err := kube.List(ctx, l, client.MatchingLabels{kubernetes.LabelManagedBy: kubernetes.ManagedBy, kubernetes.LabelUID: string(uid)}); err != nil {
		if kerrors.IsForbidden(err) || apimeta.IsNoMatchError(err) {
			return nil
		}
		return errors.Wrap(err, "cannot list the Deployments of this PodProxy, whose deletion leaves its proxy, to remove their owner reference to it")
	}
	for i := range l.Items {
		dep := &l.Items[i]
		refs := slices.DeleteFunc(slices.Clone(dep.OwnerReferences), func(r metav1.OwnerReference) bool { return r.UID == uid })
		if len(refs) == len(dep.OwnerReferences) || dep.DeletionTimestamp != nil {
			continue
		}
		if len(refs) == 0 {
			refs = nil
		}
		orig := dep.DeepCopy()
		dep.OwnerReferences = refs
		err := kube.Patch(ctx, dep, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		if kerrors.IsForbidden(err) {
			return errors.Errorf("cannot remove the owner reference to this PodProxy from Deployment %s/%s: the provider may not patch deployments.apps in %s (cluster/rbac/podproxy.yaml grants it), and without it the garbage collector would delete the proxy this deletion leaves", dep.Namespace, dep.Name, dep.Namespace)
		}
		if err != nil && !kerrors.IsNotFound(err) {
			return errors.Wrapf(err, "cannot remove the owner reference to this PodProxy from Deployment %s/%s: the garbage collector would delete the proxy its deletion leaves", dep.Namespace, dep.Name)
		}
	}
	return nil
}

// connect builds the driver of one config: this cluster through the
// manager's client (InjectedIdentity), or the cluster of a kubeconfig read
// from its Secret on every Connect (pooled by the kubeconfig's digest, so a
// rotated Secret takes effect at once).
func (b *binding) connect(ctx context.Context, cfg *external.Config) (proxy.Driver, error) {
	k := cfg.Spec.Kubernetes
	if k == nil {
		return nil, errors.Errorf("%s has no kubernetes block", cfg.Name)
	}
	c := kubernetes.Config{
		Namespace:    k.Namespace,
		Image:        k.Image,
		Resources:    k.Resources,
		NodeSelector: k.NodeSelector,
		Tolerations:  k.Tolerations,
		Affinity:     k.Affinity,

		ClusterNetworks: k.ClusterNetworks,
		NetworkPolicy:   k.NetworkPolicy == nil || *k.NetworkPolicy,
	}
	if c.Image == "" {
		c.Image = b.image
	}
	for _, s := range k.ImagePullSecrets {
		c.ImagePullSecrets = append(c.ImagePullSecrets, s.Name)
	}
	c.EgressCheck = k.EgressCheck != nil && k.EgressCheck.URL != ""
	var cl *kubernetes.Cluster
	switch k.Credentials.Source {
	case xpv2.CredentialsSourceInjectedIdentity:
		if b.localErr != nil {
			return nil, errors.Wrap(b.localErr, "cannot reach this cluster")
		}
		if b.access != nil {
			if err := b.access.check(ctx); err != nil {
				return nil, err
			}
		}
		cl = b.local
	case xpv2.CredentialsSourceSecret:
		kc, err := cfg.Secrets.Get(ctx, "spec.kubernetes.credentials.secretRef", k.Credentials.SecretRef)
		if err != nil {
			return nil, err
		}
		if cl, err = b.remote.Cluster(kc, cfg.Guard); err != nil {
			return nil, errors.Wrap(err, "spec.kubernetes.credentials.secretRef")
		}
	default:
		return nil, errors.Errorf("spec.kubernetes.credentials.source %q is not supported: want InjectedIdentity or Secret", k.Credentials.Source)
	}
	return cl.Driver(cfg.Name, c, b.prober), nil
}

// watches makes changes to a proxy's objects in this cluster reconcile its
// managed resource at once: a pod turning Ready, losing readiness or being
// deleted, a Deployment being deleted or failing to create pods, a Service
// getting its address; and a reachability check that finished in the
// background. They bypass the controller's event filter (which passes
// only changes of the managed resource's desired state) by being raw
// sources, and are filtered to the changes Get would see.
func (b *binding) watches(mgr manager.Manager, bld *builder.Builder, list client.ObjectList) *builder.Builder {
	log := mgr.GetLogger().WithName("podproxy-watches")
	toRequests, kind, err := b.proxiesByUID(mgr, list)
	if err != nil {
		log.Error(err, "cannot watch the proxies' objects; falling back to polling")
		return bld
	}
	ch := make(chan event.GenericEvent, 1024)
	b.mu.Lock()
	b.subscribers = append(b.subscribers, ch)
	b.mu.Unlock()
	bld = bld.WatchesRawSource(source.Channel(ch, enqueue[client.Object](toRequests, watchPriority)))
	if !b.mayWatch(log, kind, mgr.GetCache()) {
		return bld
	}
	return bld.
		WatchesRawSource(source.Kind(mgr.GetCache(), &corev1.Pod{}, enqueue[*corev1.Pod](toRequests, gonePriority), changed(kubernetes.PodDigest))).
		WatchesRawSource(source.Kind(mgr.GetCache(), &appsv1.Deployment{}, enqueue[*appsv1.Deployment](toRequests, watchPriority), deploymentChanged())).
		WatchesRawSource(source.Kind(mgr.GetCache(), &corev1.Service{}, enqueue[*corev1.Service](toRequests, watchPriority), changed(kubernetes.ServiceDigest)))
}

// proxiesByUID indexes the managed resources of list's kind by UID and
// returns what maps an object labelled with a proxy's UID to that proxy
// (the other scope's controller finds nothing), and the kind.
func (b *binding) proxiesByUID(mgr manager.Manager, list client.ObjectList) (func(context.Context, client.Object) []reconcile.Request, string, error) {
	gvk, err := apiutil.GVKForObject(list, mgr.GetScheme())
	if err != nil {
		return nil, "", err
	}
	// list is shared with other users (the MR state metrics list into it):
	// only its kind is read here, and each lookup uses a list of its own.
	listGVK := gvk
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	obj, err := mgr.GetScheme().New(gvk)
	if err != nil {
		return nil, "", err
	}
	mr, _ := obj.(client.Object)
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), mr, uidIndex, func(o client.Object) []string {
		return []string{string(o.GetUID())}
	}); err != nil {
		return nil, "", errors.Wrapf(err, "cannot index the %s resources by UID", gvk.Kind)
	}
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		uid := o.GetLabels()[kubernetes.LabelUID]
		if uid == "" {
			return nil
		}
		o2, err := mgr.GetScheme().New(listGVK)
		if err != nil {
			return nil
		}
		l, _ := o2.(client.ObjectList)
		if err := mgr.GetClient().List(ctx, l, client.MatchingFields{uidIndex: uid}); err != nil {
			return nil
		}
		var out []reconcile.Request
		_ = apimeta.EachListItem(l, func(o runtime.Object) error {
			if m, ok := o.(client.Object); ok {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}})
			}
			return nil
		})
		return out
	}, gvk.Kind, nil
}

// mayWatch reports whether the provider may watch pods, Deployments and
// Services in this cluster, and then follows Deployment deletions too.
// Without the permission such a watch would never sync and stop the
// manager: PodProxies are then polled, and report what is missing (see
// connect).
func (b *binding) mayWatch(log logr.Logger, kind string, informers cache.Informers) bool {
	if b.access != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var missing *missingError
		if err := b.access.check(ctx); errors.As(err, &missing) {
			log.Info("not watching pods, Deployments and Services: PodProxies on InjectedIdentity wait for the permissions (restart the provider after granting them to watch again)", "kind", kind, "error", err.Error())
			return false
		}
	}
	if b.local != nil {
		if err := b.local.WatchDeletions(informers); err != nil {
			log.Info("cannot follow Deployment deletions; a deleted PodProxy reads its Deployment's absence live", "error", err.Error())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.local.IndexPods(ctx, informers); err != nil {
			log.Info("cannot index the cached pods; a PodProxy's pods are found among all of them", "error", err.Error())
		}
	}
	return true
}

// probeWait is how long a reconcile waits for the check that the proxy's
// Squid answers before reporting it pending (squid.Prober.Wait, 250 ms by
// default). A pod's address here answers within milliseconds, unless the
// machine is loaded, as when hundreds of pods turn Ready together: then a
// check past the default would make the resource write a status of its
// own ("checking that the proxy answers") and wait for another reconcile
// to turn Ready; waiting a little longer costs a worker for that time
// instead.
const probeWait = time.Second

// watchPriority is the work-queue priority of reconciles these watches
// cause. Above the default (0) of new and polled resources: under load,
// finishing a proxy whose pod just turned Ready comes before starting new
// ones, so a Ready pod makes a Ready resource at once rather than behind
// the queue. The priority stays with the item through its requeues.
const watchPriority = 10

// gonePriority is the work-queue priority of reconciles a pod's deletion
// causes. Above watchPriority: a resource being deleted keeps its
// finalizer until its last pod is gone, and in a burst of deletes the
// other watch events (the Deployment controller's and the garbage
// collector's work on the other proxies) would hold that reconcile
// behind them.
const gonePriority = 20

// enqueue maps an event's object to its proxy and queues it at
// watchPriority, or at deleted for a deletion (the object's labels, and so
// its proxy, never change, so an update maps the new object only).
func enqueue[T client.Object](toRequests func(context.Context, client.Object) []reconcile.Request, deleted int) handler.TypedEventHandler[T, reconcile.Request] {
	add := func(ctx context.Context, o T, q workqueue.TypedRateLimitingInterface[reconcile.Request], priority int) {
		reqs := toRequests(ctx, o)
		if len(reqs) == 0 {
			return
		}
		if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
			pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(priority)}, reqs...)
			return
		}
		for _, r := range reqs {
			q.Add(r)
		}
	}
	return handler.TypedFuncs[T, reconcile.Request]{
		CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[T], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q, watchPriority)
		},
		UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[T], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.ObjectNew, q, watchPriority)
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[T], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q, deleted)
		},
		GenericFunc: func(ctx context.Context, e event.TypedGenericEvent[T], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q, watchPriority)
		},
	}
}

// notify is the prober's: a check that finished in the background
// reconciles its proxy (the key starts with the proxy's UID).
func (b *binding) notify(key string) {
	uid, _, _ := strings.Cut(key, "/")
	ev := event.GenericEvent{Object: &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{kubernetes.LabelUID: uid}}}}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ch := range b.subscribers {
		select {
		case ch <- ev:
		default: // full: the next poll sees the result
		}
	}
}

// changed passes deletions and the updates that change digest; creations
// are the driver's own doing and change nothing Get reports, except for a
// Service (its address may be assigned at creation).
func changed[T client.Object](digest func(T) string) predicate.TypedFuncs[T] {
	return predicate.TypedFuncs[T]{
		CreateFunc:  func(e event.TypedCreateEvent[T]) bool { _, svc := any(e.Object).(*corev1.Service); return svc },
		UpdateFunc:  func(e event.TypedUpdateEvent[T]) bool { return digest(e.ObjectOld) != digest(e.ObjectNew) },
		DeleteFunc:  func(event.TypedDeleteEvent[T]) bool { return true },
		GenericFunc: func(event.TypedGenericEvent[T]) bool { return true },
	}
}

// deploymentChanged is changed for Deployments, except for a deletion that
// did not wait (a background one, the driver's Delete of a Deployment with
// a pod): the resource being deleted waits for the pod, whose deletion
// reconciles it, and a reconcile now would only repeat the Delete (an
// event). A deletion that waited for finalizers (in the foreground) ends
// the resource and passes, as does one the watch missed. A Deployment a
// human deleted in the background is noticed when its pods go, or at the
// next poll.
func deploymentChanged() predicate.TypedFuncs[*appsv1.Deployment] {
	p := changed(kubernetes.DeploymentDigest)
	p.DeleteFunc = func(e event.TypedDeleteEvent[*appsv1.Deployment]) bool {
		return e.DeleteStateUnknown || e.Object.GetDeletionTimestamp() != nil
	}
	return p
}
