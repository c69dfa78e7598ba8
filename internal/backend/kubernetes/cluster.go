package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Cluster is how the driver reaches one target cluster.
type Cluster struct {
	// Client reads (possibly from a cache) and writes.
	Client client.Client
	// Live reads from the API server; nil when Client's reads already do.
	Live client.Reader
	// Host is the API server's address.
	Host string
	// Version reads the API server's version.
	Version func(ctx context.Context) (string, error)
	// DialPods: the provider runs in this cluster and reaches its pods.
	DialPods bool
	// PodLog reads a container's log (pods/log).
	PodLog PodLogFunc
	// Networks are the cluster's own networks where another part of the
	// provider discovers them (Options.Networks); nil: each driver reads.
	Networks netguard.Networks
	// quiet: the cluster is a tenant's (a namespaced config's kubeconfig):
	// errors never quote what its server answered.
	quiet bool
	// guard checks and dials the addresses the cluster reports for a
	// proxy (a LoadBalancer's); nil for the platform's clusters.
	guard *netguard.Guard
	// closeIdle closes the idle connections of a pooled remote Cluster.
	closeIdle func()
	// gone are the Deployments the cache's watch saw deleted (this
	// cluster's only, once WatchDeletions ran: a remote one is read
	// directly).
	gone     atomic.Pointer[gone]
	goneOnce sync.Once
	// taken are the names whose Create was refused, for every driver of
	// the Cluster (drivers are made per reconcile).
	taken taken
	// unfinished are the proxies whose Create made the Deployment but not
	// all its children, for every driver of the Cluster.
	unfinished taken
	// absent are the children the orphan sweep found missing, per proxy,
	// for every driver of the Cluster.
	absent absent
	// refused are where a deletecollection was refused, for every driver
	// of the Cluster.
	refused refused
	// podIndex: the cache indexes pods by their proxy's UID (IndexPods).
	podIndex     atomic.Bool
	podIndexOnce sync.Once
}

// podUIDIndex is the cache's index of pods by their proxy's UID label.
const podUIDIndex = "egressproxy.io/proxy-uid"

// proxyUID is the index value of a pod: its proxy's UID.
func proxyUID(o client.Object) []string {
	if uid := o.GetLabels()[LabelUID]; uid != "" {
		return []string{uid}
	}
	return nil
}

// IndexPods indexes the pods of the cache behind fi by their proxy's UID
// (LabelUID), which the drivers made after it list a proxy's pods by:
// unindexed, each list of one proxy's pods goes through every cached pod
// of the namespace, so the provider's CPU grew with the square of the
// proxies. Call it only once the provider may list and watch pods in
// every namespace (as WatchDeletions); it waits for the pods' informer to
// sync. Later calls do nothing.
func (cl *Cluster) IndexPods(ctx context.Context, fi client.FieldIndexer) error {
	var err error
	cl.podIndexOnce.Do(func() {
		err = fi.IndexField(ctx, &corev1.Pod{}, podUIDIndex, proxyUID)
		if err == nil {
			cl.podIndex.Store(true)
		}
	})
	return err
}

// NewCluster is the Cluster of a rest config: c (which may read from a
// cache) and live (nil when c reads directly). Its version and pod-log
// reads go through hc, c's HTTP client (nil: one of cfg's own), so they
// share its connections and its redirect check. Set DialPods on the
// result for the cluster the provider runs in.
func NewCluster(cfg *rest.Config, hc *http.Client, c client.Client, live client.Reader) (*Cluster, error) {
	if hc == nil {
		var err error
		if hc, err = rest.HTTPClientFor(cfg); err != nil {
			return nil, err
		}
	}
	dc, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	rc := dc.RESTClient()
	return &Cluster{
		Client: c,
		Live:   live,
		Host:   cfg.Host,
		Version: func(ctx context.Context) (string, error) {
			// The discovery client's ServerVersion takes no context.
			b, err := rc.Get().AbsPath("/version").Do(ctx).Raw()
			if err != nil {
				return "", err
			}
			var v version.Info
			if err := json.Unmarshal(b, &v); err != nil {
				return "", err
			}
			return v.GitVersion, nil
		},
		PodLog: func(ctx context.Context, namespace, pod, container string, tailLines, limitBytes int64) ([]byte, error) {
			body, err := rc.Get().AbsPath("/api/v1/namespaces", namespace, "pods", pod, "log").
				Param("container", container).Param("timestamps", "true").
				Param("tailLines", strconv.FormatInt(tailLines, 10)).Param("limitBytes", strconv.FormatInt(limitBytes, 10)).
				Stream(ctx)
			if err != nil {
				return nil, err
			}
			defer func() { _ = body.Close() }()
			// limitBytes is the kubelet's to honour; a server that does
			// not is cut off where the kubelet would cut.
			r := io.Reader(body)
			if limitBytes > 0 {
				r = io.LimitReader(body, limitBytes)
			}
			return io.ReadAll(r)
		},
	}, nil
}

// NewLocalCluster is the Cluster of the cluster the provider runs in,
// DialPods set: reads from cache (the manager's, which holds the labelled
// objects: CacheByObject), Secrets and live reads from the API server, and
// writes, all through clients of Observed(cfg), so that every request the
// driver makes is a span, a log line and a metric, and none that
// crossplane-runtime makes on the manager's client is counted as one.
func NewLocalCluster(cfg *rest.Config, scheme *runtime.Scheme, reader client.Reader) (*Cluster, error) {
	cfg = Observed(cfg)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	live, err := client.New(cfg, client.Options{Scheme: scheme, HTTPClient: hc})
	if err != nil {
		return nil, err
	}
	// As the manager's client: Secrets are never cached (the provider
	// would otherwise watch every Secret of the cluster).
	c, err := client.New(cfg, client.Options{Scheme: scheme, HTTPClient: hc, Cache: &client.CacheOptions{Reader: reader, DisableFor: []client.Object{&corev1.Secret{}}}})
	if err != nil {
		return nil, err
	}
	cl, err := NewCluster(cfg, hc, c, live)
	if err != nil {
		return nil, err
	}
	cl.DialPods = true
	return cl, nil
}

// WatchDeletions keeps, from the Deployment informer of informers, which
// Deployments the watch saw deleted, so that the drivers made after it
// trust a cache miss of those (see gone). Call it only once the provider
// may list and watch Deployments in every namespace: an informer it may
// not list never syncs, and the manager's cache waits for every informer
// it has before any controller starts. Later calls do nothing.
func (cl *Cluster) WatchDeletions(informers cache.Informers) error {
	var err error
	cl.goneOnce.Do(func() {
		var i cache.Informer
		if i, err = informers.GetInformer(context.Background(), &appsv1.Deployment{}, cache.BlockUntilSynced(false)); err != nil {
			return
		}
		g := newGone()
		if _, err = i.AddEventHandler(g.handler()); err == nil {
			cl.gone.Store(g)
		}
	})
	return err
}

// Driver returns a driver for cl.
func (cl *Cluster) Driver(provider string, cfg Config, prober *squid.Prober) *Driver {
	d := New(Options{Provider: provider, Config: cfg, Client: cl.Client, Live: cl.Live, Version: cl.Version, Host: cl.Host, Prober: prober, DialPods: cl.DialPods, PodLog: cl.PodLog, Networks: cl.Networks})
	d.podIndex = cl.podIndex.Load()
	d.gone = cl.gone.Load()
	d.taken = &cl.taken
	d.unfinished = &cl.unfinished
	d.absent = &cl.absent
	d.refused = &cl.refused
	d.quiet, d.guard = cl.quiet, cl.guard
	return d
}

// Remote builds and pools the Clusters of kubeconfigs. A Cluster is keyed
// by a digest of the kubeconfig's bytes, so a rotated Secret makes a new
// one at the next Connect, and the old one is dropped once unused.
type Remote struct {
	// Scheme of the clients; it must know apps/v1 and core/v1.
	Scheme *runtime.Scheme
	// Max is how many Clusters are kept; default 32.
	Max int
	// IdleTTL is how long a Cluster no Connect asked for is kept (its
	// configs are gone, or their kubeconfig was rotated); default 10
	// minutes. Its idle connections are closed when it goes.
	IdleTTL time.Duration

	mu    sync.Mutex
	pool  map[remoteKey]*remoteCluster
	build func(kubeconfig []byte, guard *netguard.Guard) (*Cluster, error)
	now   func() time.Time
	// maxAnswer bounds one answer's body (tests); maxAnswer when 0.
	maxAnswer int64
}

// remoteKey is a pooled Cluster's: the kubeconfig's digest and the guard
// it dials through, so a tenant's kubeconfig never shares a platform
// config's unguarded connections.
type remoteKey struct {
	kubeconfig [32]byte
	guard      *netguard.Guard
}

type remoteCluster struct {
	cluster *Cluster
	used    time.Time
}

// drop forgets the pooled cluster of key and closes its idle connections;
// r.mu held.
func (r *Remote) drop(key remoteKey) {
	if e := r.pool[key]; e != nil && e.cluster.closeIdle != nil {
		e.cluster.closeIdle()
	}
	delete(r.pool, key)
}

// Cluster returns the pooled Cluster of kubeconfig, building it if needed;
// with a guard (a namespaced config's kubeconfig) every connection to its
// server goes through the guard, and the server's answers are not quoted
// in errors. Errors are Permanent: only a changed kubeconfig helps.
func (r *Remote) Cluster(kubeconfig []byte, guard *netguard.Guard) (*Cluster, error) {
	key := remoteKey{sha256.Sum256(kubeconfig), guard}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pool == nil {
		r.pool = map[remoteKey]*remoteCluster{}
	}
	now := time.Now
	if r.now != nil {
		now = r.now
	}
	idle := r.IdleTTL
	if idle <= 0 {
		idle = 10 * time.Minute
	}
	for k, e := range r.pool {
		if k != key && now().Sub(e.used) > idle {
			r.drop(k)
		}
	}
	if e, ok := r.pool[key]; ok {
		e.used = now()
		return e.cluster, nil
	}
	build := r.build
	if build == nil {
		build = r.newCluster
	}
	cl, err := build(kubeconfig, guard)
	if err != nil {
		return nil, err
	}
	max := r.Max
	if max <= 0 {
		max = 32
	}
	for len(r.pool) >= max {
		var oldest remoteKey
		var at time.Time
		for k, e := range r.pool {
			if at.IsZero() || e.used.Before(at) {
				oldest, at = k, e.used
			}
		}
		r.drop(oldest)
	}
	r.pool[key] = &remoteCluster{cluster: cl, used: now()}
	return cl, nil
}

func (r *Remote) newCluster(kubeconfig []byte, guard *netguard.Guard) (*Cluster, error) {
	cfg, err := RESTConfigFromKubeconfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	switch {
	case guard != nil && cfg.Proxy != nil:
		// The kubeconfig's proxy-url is the tenant's: its address is
		// checked like the server's.
		cfg.Proxy, cfg.Dial = guard.Via(cfg.Proxy, guard.DialContext)
	case guard != nil:
		// client-go's default proxy is the environment's, as here: the
		// platform team's, dialled as it is.
		cfg.Proxy, cfg.Dial = guard.Via(nil, nil)
	}
	if guard != nil {
		// A tenant's server may answer without end. The platform's own
		// clusters are read whole: a List of a big cluster's nodes (the
		// cluster's networks) is one unpaginated answer.
		limit := r.maxAnswer
		if limit <= 0 {
			limit = maxAnswer
		}
		server := cfg.Host
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return capAnswers(rt, limit, server) })
	}
	cfg = Observed(cfg)
	// One HTTP client of its own, so its connections can be closed when
	// the Cluster leaves the pool.
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, proxy.Permanentf("cannot build a client from the kubeconfig: %s", redacted(kubeconfig, err))
	}
	if guard != nil {
		// An API server does not redirect: a tenant's that does is not
		// followed, so nothing connects to where it led.
		hc.CheckRedirect = guard.NoRedirects
	}
	c, err := client.New(cfg, client.Options{Scheme: r.Scheme, HTTPClient: hc})
	if err != nil {
		return nil, proxy.Permanentf("cannot build a client from the kubeconfig: %s", redacted(kubeconfig, err))
	}
	cl, err := NewCluster(cfg, hc, c, nil)
	if err != nil {
		return nil, proxy.Permanentf("cannot build a client from the kubeconfig: %s", redacted(kubeconfig, err))
	}
	cl.closeIdle = hc.CloseIdleConnections
	cl.quiet, cl.guard = guard != nil, guard
	return cl, nil
}

// CacheByObject is the manager cache configuration the driver needs for
// the provider's own cluster: only the objects carrying the managed-by
// label, so the provider never caches every pod of the cluster, and pods
// without the spec (the driver reads their metadata and status only).
// Secrets are not cached: the driver only writes its own.
func CacheByObject() map[client.Object]cache.ByObject {
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy})
	return map[client.Object]cache.ByObject{
		&corev1.Pod{}:        {Label: sel, Transform: StripPod},
		&appsv1.Deployment{}: {Label: sel, Transform: StripDeployment},
		&corev1.Service{}:    {Label: sel, Transform: cache.TransformStripManagedFields()},
	}
}

// StripPod is the cache transform of pods: what Get reads (the metadata
// without owner references and managed fields, only the config-hash
// annotation; the phase, address, Ready and PodScheduled conditions and
// why containers wait or restarted), nothing else.
func StripPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	p.ManagedFields = nil
	p.OwnerReferences = nil
	if h, ok := p.Annotations[AnnotationConfigHash]; ok {
		p.Annotations = map[string]string{AnnotationConfigHash: h}
	} else {
		p.Annotations = nil
	}
	p.Spec = corev1.PodSpec{}
	st := corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady || c.Type == corev1.PodScheduled {
			st.Conditions = append(st.Conditions, corev1.PodCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
			Name: cs.Name, Ready: cs.Ready, RestartCount: cs.RestartCount,
			State:                corev1.ContainerState{Waiting: cs.State.Waiting},
			LastTerminationState: corev1.ContainerState{Terminated: cs.LastTerminationState.Terminated},
		})
	}
	p.Status = st
	return p, nil
}

// StripDeployment is the cache transform of Deployments: what Get and
// Update read (metadata, replicas, selector, the pod template's config
// hash and the container ports, status), without the rest of the pod template
// and the managed fields. A thousand proxies' Deployments then take a
// fraction of the memory.
func StripDeployment(o any) (any, error) {
	d, ok := o.(*appsv1.Deployment)
	if !ok {
		return o, nil
	}
	d.ManagedFields = nil
	var containers []corev1.Container
	for _, c := range d.Spec.Template.Spec.Containers {
		containers = append(containers, corev1.Container{Name: c.Name, Ports: c.Ports})
	}
	d.Spec.Template.Spec = corev1.PodSpec{Containers: containers}
	// Of the pod template's metadata only the config hash is read; an
	// update writes the whole template anew.
	tm := metav1.ObjectMeta{}
	if h, ok := d.Spec.Template.Annotations[AnnotationConfigHash]; ok {
		tm.Annotations = map[string]string{AnnotationConfigHash: h}
	}
	d.Spec.Template.ObjectMeta = tm
	return d, nil
}

// String describes cl without credentials.
func (cl *Cluster) String() string { return fmt.Sprintf("cluster at %s", cl.Host) }
