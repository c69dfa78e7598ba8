package kubernetes_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes/kubelettest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

const (
	testProvider     = "ClusterProviderConfig conformance"
	testInstallation = "proxytest-k8s"
	holdFinalizer    = "proxytest.egressproxy.io/hold"
)

// env is a real control plane (kube-apiserver, etcd, and
// kube-controller-manager with the garbage collector and the Deployment
// and ReplicaSet controllers), a cache configured as the provider's manager
// configures it, and the kubelet stand-in with a TCP listener per pod.
type env struct {
	cp      *controlplane.ControlPlane
	scheme  *runtime.Scheme
	live    client.Client
	cached  client.Client
	cache   cache.Cache
	kubelet *kubelettest.Kubelet
	remote  *kubernetes.Cluster
	seq     atomic.Int32
}

func startEnv(t *testing.T) *env {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cp := controlplane.ForTest(t, controlplane.Options{CRDDirectories: []string{filepath.Join(root, "package", "crds")}, ControllerManager: true})
	e := &env{cp: cp, scheme: runtime.NewScheme()}
	if err := clientgoscheme.AddToScheme(e.scheme); err != nil {
		t.Fatal(err)
	}
	cfg := cp.Config
	cfg.QPS, cfg.Burst = 500, 1000
	if e.live, err = client.New(cfg, client.Options{Scheme: e.scheme}); err != nil {
		t.Fatal(err)
	}
	if e.cache, err = cache.New(cfg, cache.Options{Scheme: e.scheme, ByObject: kubernetes.CacheByObject()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = e.cache.Start(ctx) }()
	// Informers start on first use; start them now so the first reads do
	// not wait for a sync.
	for _, o := range []client.Object{&corev1.Pod{}, &appsv1.Deployment{}, &corev1.Service{}} {
		if _, err := e.cache.GetInformer(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if !e.cache.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	if e.cached, err = client.New(cfg, client.Options{Scheme: e.scheme, Cache: &client.CacheOptions{Reader: e.cache, DisableFor: []client.Object{&corev1.Secret{}}}}); err != nil {
		t.Fatal(err)
	}
	if e.kubelet, err = kubelettest.New(cfg, kubelettest.Options{Mode: kubelettest.Listen}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.kubelet.Stop)
	if e.remote, err = (&kubernetes.Remote{Scheme: e.scheme}).Cluster(cp.Kubeconfig, nil); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestDriverIntegration runs, on one real control plane, the proxy.Driver
// conformance suite (Conformance/...) and the driver's own behaviour
// (driver_integration_test.go).
//
// The conformance suite runs twice: with the provider's
// own cluster (reads from the cache, as in production with
// InjectedIdentity) and with a cluster reached by kubeconfig (uncached,
// through the Remote pool). Pokes: Settle (the kubelet stand-in reports
// the pods Ready with a listener on their address, then waits for the
// rollout, or after a Delete for the garbage collector; and for the cache
// to catch up), PartialCreate (a Secret and NetworkPolicy left without
// their Deployment) with Leftovers, Foreign, ForeignMarked, SetUnknownState (a pod phase the
// driver does not know), SetBusy (every API call answers 429), HoldDelete
// (a finalizer on the Deployment), ReportEgress (ErrAlwaysReached: the
// provider dials the pods here), LogOutput and MalformedIDs.
func TestDriverIntegration(t *testing.T) {
	e := startEnv(t)
	t.Run("Conformance", func(t *testing.T) {
		t.Run("ThisCluster", func(t *testing.T) { proxytest.Run(t, proxytest.Harness{Complete: true, New: e.fixture(true)}) })
		t.Run("KubeconfigSecret", func(t *testing.T) { proxytest.Run(t, proxytest.Harness{Complete: true, New: e.fixture(false)}) })
	})
	t.Run("RemoteIdentity", e.remoteIdentityTests)
	e.driverTests(t)
	t.Run("Replicas", e.replicaTests)
	t.Run("Takeover", e.takeoverTests)
	t.Run("Faults", e.faultTests)
	t.Run("Leftovers", e.leftoverTests)
	t.Run("DeleteByMark", e.deleteByMarkTests)
}

// fixture returns fixtures in a fresh namespace each.
func (e *env) fixture(cached bool) func(t *testing.T) proxytest.Fixture {
	return func(t *testing.T) proxytest.Fixture {
		ctx := context.Background()
		ns := fmt.Sprintf("pt-%d", e.seq.Add(1))
		if err := e.live.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = e.live.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		})

		busy := &atomic.Bool{}
		logs := &testenv.Buffer{}
		log := funcr.New(func(prefix, args string) { logs.Line(prefix + " " + args) }, funcr.Options{Verbosity: 2})
		o := kubernetes.Options{
			Provider: testProvider,
			Config:   kubernetes.Config{Namespace: ns},
			Version:  e.remote.Version,
			Host:     e.cp.Config.Host,
			Log:      &log,
			// Loopback: the pods' listeners are reachable from here.
			DialPods: true,
		}
		if cached {
			o.Client, o.Live = &busyClient{Client: e.cached, busy: busy}, &busyClient{Client: e.live, busy: busy}
		} else {
			o.Client = &busyClient{Client: e.remote.Client, busy: busy}
		}
		d := kubernetes.New(o)
		return proxytest.Fixture{
			Driver:   d,
			Provider: testProvider,
			Request: func(name, uid string) proxy.Request {
				return proxy.Request{
					Name: name,
					Mark: proxy.Mark{UID: uid, InstallationID: testInstallation},
					Proxy: proxy.Settings{
						Port:               3128,
						AllowedClientCIDRs: []string{"10.0.0.0/8"},
						AllowedPorts:       []int32{443},
					},
				}
			},
			Settle:  func(ctx context.Context, id string) error { return e.settle(ctx, id, cached) },
			Foreign: func(ctx context.Context, name string) error { return e.foreign(ctx, ns, name, nil, cached) },
			ForeignMarked: func(ctx context.Context, name, uid string) error {
				return e.foreign(ctx, ns, name, marked(name, uid), cached)
			},
			PartialCreate:   func(ctx context.Context, name, uid string) error { return e.orphanedChildren(ctx, ns, name, uid) },
			Leftovers:       func(ctx context.Context, name string) ([]string, error) { return e.children(ctx, ns, name) },
			SetUnknownState: func(ctx context.Context, id string) error { return e.unknownState(ctx, id, cached) },
			SetBusy:         func(_ context.Context, b bool) { busy.Store(b) },
			HoldDelete:      func(ctx context.Context, id string) func() { return e.holdDelete(t, ctx, id, cached) },
			// Both reach the pods (DialPods, on loopback): a pod's own
			// report is never read. A pod that reports because the
			// provider cannot reach it runs on the real node
			// (TestPodProxyRealNodeIntegration/EgressAddressReportedFromInsideThePod).
			ReportEgress: func(context.Context, string, string) error { return proxytest.ErrAlwaysReached },
			// Pod and Service addresses are the cluster's.
			GuestReportsAddress: func(context.Context, string, string) error { return proxytest.ErrAddressNotGuests },
			LogOutput:           logs.String,
			MalformedIDs: []string{
				"pt-alpha",                 // a name, not an ID
				ns + "/",                   // no name
				"/pt-alpha",                // no namespace
				ns + "/Not_A_Name",         // not a name
				ns + "/pt-alpha/extra",     // too many parts
				"Bad_Namespace/pt-alpha",   // not a namespace
				"hosts/beelink/domains/pt", // another backend's
			},
		}
	}
}

func marked(name, uid string) map[string]string {
	return map[string]string{
		kubernetes.LabelManagedBy:    kubernetes.ManagedBy,
		kubernetes.LabelName:         name,
		kubernetes.LabelUID:          uid,
		kubernetes.LabelInstallation: testInstallation,
	}
}

// orphanedChildren leaves what a proxy's Deployment leaves when it goes
// with its children orphaned (kubectl delete --cascade=orphan), or what a
// create that wrote the children first leaves: its Secret and
// NetworkPolicy, marked for uid, owned by nothing, without a Deployment.
func (e *env) orphanedChildren(ctx context.Context, ns, name, uid string) error {
	labels := marked(name, uid)
	for _, obj := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, StringData: map[string]string{"squid.conf": "# left over\n"}},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		}},
	} {
		if err := e.live.Create(ctx, obj); err != nil {
			return err
		}
	}
	return nil
}

// children lists the Secret, NetworkPolicy and Service of name that
// remain, by kind.
func (e *env) children(ctx context.Context, ns, name string) ([]string, error) {
	var left []string
	for _, obj := range []client.Object{&corev1.Secret{}, &networkingv1.NetworkPolicy{}, &corev1.Service{}} {
		err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj)
		switch {
		case err == nil:
			left = append(left, fmt.Sprintf("%T %s", obj, name))
		case !kerrors.IsNotFound(err):
			return nil, err
		}
	}
	return left, nil
}

// foreign creates a Deployment named name, with labels (nil: a human's,
// unmarked), and waits until the driver's cache has it.
func (e *env) foreign(ctx context.Context, ns, name string, labels map[string]string, cached bool) error {
	sel := map[string]string{"app": "foreign-" + name}
	podLabels := map[string]string{"app": "foreign-" + name}
	for k, v := range labels {
		podLabels[k] = v
	}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
			},
		},
	}
	if err := e.live.Create(ctx, dep); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return e.waitCache(ctx, ns, name, cached)
}

// settle finishes what is pending for the Deployment id: its pods are
// started and reported Ready and the rollout completes; or, when it is gone
// or going, its pods are gone too (the garbage collector removes them after
// a Deployment deleted in the background). Then it waits for the cache.
func (e *env) settle(ctx context.Context, id string, cached bool) error {
	ns, name, _ := strings.Cut(id, "/")
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		dep := &appsv1.Deployment{}
		err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, dep)
		switch {
		case kerrors.IsNotFound(err):
			pods, err := e.pods(ctx, e.live, ns, name)
			if err != nil {
				return err
			}
			if len(pods) == 0 {
				return e.waitCache(ctx, ns, name, cached)
			}
		case err != nil:
			return err
		case dep.DeletionTimestamp != nil:
			// The garbage collector is at work.
		default:
			pods, err := e.pods(ctx, e.live, ns, name)
			if err != nil {
				return err
			}
			allReady := len(pods) > 0
			for _, p := range pods {
				if p.DeletionTimestamp != nil {
					allReady = false
					continue
				}
				if !podReady(&p) {
					allReady = false
					if err := e.kubelet.StartPod(ctx, ns, p.Name); err != nil && !kerrors.IsNotFound(err) {
						return err
					}
				}
			}
			s := dep.Status
			if allReady && s.ObservedGeneration >= dep.Generation && s.Replicas == 1 && s.UpdatedReplicas == 1 && s.AvailableReplicas == 1 && len(pods) == 1 {
				return e.waitCache(ctx, ns, name, cached)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("settling %s: %w", id, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pods are the pods of the proxy name in ns.
func (e *env) pods(ctx context.Context, r client.Reader, ns, name string) ([]corev1.Pod, error) {
	l := &corev1.PodList{}
	if err := r.List(ctx, l, client.InNamespace(ns), client.MatchingLabels{kubernetes.LabelName: name}); err != nil {
		return nil, err
	}
	return l.Items, nil
}

// waitCache waits until the cache holds what the API server holds of the
// proxy name: its Deployment and pods, at the same resource versions.
func (e *env) waitCache(ctx context.Context, ns, name string, cached bool) error {
	if !cached {
		return nil
	}
	state := func(r client.Reader) (string, error) {
		var b strings.Builder
		dep := &appsv1.Deployment{}
		err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, dep)
		switch {
		case kerrors.IsNotFound(err):
			b.WriteString("none")
		case err != nil:
			return "", err
		case dep.Labels[kubernetes.LabelManagedBy] != kubernetes.ManagedBy:
			b.WriteString("unlabelled")
		default:
			b.WriteString(dep.ResourceVersion)
		}
		pods, err := e.pods(ctx, r, ns, name)
		if err != nil {
			return "", err
		}
		for _, p := range pods {
			b.WriteString("," + p.Name + "@" + p.ResourceVersion)
		}
		return b.String(), nil
	}
	for {
		want, err := state(e.live)
		if err != nil {
			return err
		}
		got, err := state(e.cache)
		if err != nil {
			return err
		}
		if got == want || (want == "unlabelled" && got == "none") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cache did not catch up with %s/%s (cache %s, API %s): %w", ns, name, got, want, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// unknownState puts every pod of the proxy in a phase no driver knows.
func (e *env) unknownState(ctx context.Context, id string, cached bool) error {
	ns, name, _ := strings.Cut(id, "/")
	pods, err := e.pods(ctx, e.live, ns, name)
	if err != nil {
		return err
	}
	for i := range pods {
		p := &pods[i]
		p.Status.Phase = "Hibernating"
		for j := range p.Status.Conditions {
			if p.Status.Conditions[j].Type == corev1.PodReady {
				p.Status.Conditions[j].Status = corev1.ConditionFalse
			}
		}
		if err := e.live.Status().Update(ctx, p); err != nil {
			return err
		}
	}
	return e.waitCache(ctx, ns, name, cached)
}

// holdDelete deletes the Deployment in the foreground with a finalizer of
// its own holding it, until release.
func (e *env) holdDelete(t *testing.T, ctx context.Context, id string, cached bool) func() { //nolint:revive // t first, as tests do.
	ns, name, _ := strings.Cut(id, "/")
	key := types.NamespacedName{Namespace: ns, Name: name}
	dep := &appsv1.Deployment{}
	if err := e.live.Get(ctx, key, dep); err != nil {
		t.Fatalf("HoldDelete: %v", err)
	}
	dep.Finalizers = append(dep.Finalizers, holdFinalizer)
	if err := e.live.Update(ctx, dep); err != nil {
		t.Fatalf("HoldDelete: %v", err)
	}
	if err := e.live.Delete(ctx, dep, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		t.Fatalf("HoldDelete: %v", err)
	}
	if err := e.waitCache(ctx, ns, name, cached); err != nil {
		t.Fatalf("HoldDelete: %v", err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			for range 50 {
				d := &appsv1.Deployment{}
				if err := e.live.Get(context.Background(), key, d); err != nil {
					return
				}
				var keep []string
				for _, f := range d.Finalizers {
					if f != holdFinalizer {
						keep = append(keep, f)
					}
				}
				d.Finalizers = keep
				if err := e.live.Update(context.Background(), d); err == nil || kerrors.IsNotFound(err) {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// busyClient answers every call with 429 Too Many Requests while busy, as
// an overloaded API server does.
type busyClient struct {
	client.Client
	busy *atomic.Bool
}

func (b *busyClient) err() error {
	if b.busy.Load() {
		return kerrors.NewTooManyRequests("the server is busy (proxytest)", 1)
	}
	return nil
}

func (b *busyClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := b.err(); err != nil {
		return err
	}
	return b.Client.Get(ctx, key, obj, opts...)
}

func (b *busyClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := b.err(); err != nil {
		return err
	}
	return b.Client.List(ctx, list, opts...)
}

func (b *busyClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := b.err(); err != nil {
		return err
	}
	return b.Client.Create(ctx, obj, opts...)
}

func (b *busyClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := b.err(); err != nil {
		return err
	}
	return b.Client.Update(ctx, obj, opts...)
}

func (b *busyClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := b.err(); err != nil {
		return err
	}
	return b.Client.Patch(ctx, obj, patch, opts...)
}

func (b *busyClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	if err := b.err(); err != nil {
		return err
	}
	return b.Client.Apply(ctx, obj, opts...)
}

func (b *busyClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if err := b.err(); err != nil {
		return err
	}
	return b.Client.Delete(ctx, obj, opts...)
}

func (b *busyClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	if err := b.err(); err != nil {
		return err
	}
	return b.Client.DeleteAllOf(ctx, obj, opts...)
}
