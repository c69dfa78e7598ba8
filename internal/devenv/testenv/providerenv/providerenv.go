// Package providerenv is the integration tests' harness for the
// provider's controllers: a real control plane (internal/controlplane,
// through testenv.Start), the controllers running in the test's process
// on a manager configured as cmd/provider configures it
// (controller.ManagerOptions, controller.SetupBindings), one buffer with
// everything they log, and the waits every such test needs.
//
// It is a package of its own, not part of testenv, because it imports the
// controllers, whose packages' own tests import testenv.
package providerenv

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes/kubelettest"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	pconfig "github.com/egressproxy/provider-egressproxy/internal/controller/config"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/netnshost"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
)

// Namespace is the provider's namespace in the harness (created by Start).
const Namespace = "crossplane-system"

// Options configure Start. The zero value runs every kind of the provider
// on a new control plane.
type Options struct {
	// ControlPlane are the options of the control plane Start starts
	// (testenv.Start adds the provider's CRDs); unused with Cluster.
	ControlPlane controlplane.Options
	// Cluster is a control plane to run on instead of a new one.
	Cluster *controlplane.ControlPlane

	// Bindings are the kinds to run, made with the manager; nil runs
	// every kind, as cmd/provider does (controller.Bindings).
	Bindings func(ctrl.Manager, external.Options) []external.Binding

	// InstallationID is the provider's installation (default
	// "test-install").
	InstallationID string
	// PollInterval is how often a Ready proxy is observed (default 1 min).
	PollInterval time.Duration
	// NotReadyPollInterval is how often a proxy that is not Ready yet is
	// observed (default 300 ms).
	NotReadyPollInterval time.Duration
	// MaxConcurrentReconciles per controller (default 4).
	MaxConcurrentReconciles int
	// Health configures the config health checks (default: every minute,
	// a 10 s timeout, no orphan sweep).
	Health pcontroller.HealthOptions

	// Namespaces are created before the controllers start, besides
	// Namespace.
	Namespaces []string
	// Objects are created, in order, after the namespaces and before the
	// controllers start.
	Objects []client.Object

	// TenantGuard dials the endpoints of namespaced ProviderConfigs. Nil:
	// LoopbackAllowed, since the tests' backends (fakes, sshd, registries)
	// listen on loopback and on netnshost hosts; attack tests give one
	// that refuses them (netguard.New(netguard.Options{})).
	TenantGuard *netguard.Guard

	// Timeout bounds each of the Env's waits (default 30 s).
	Timeout time.Duration
	// Logs is the buffer of Env.Logs (default: a new one): given, a test
	// can send a driver's own log there too.
	Logs *testenv.Buffer
}

// LoopbackAllowed is the tenant guard of the harness by default: as the
// provider's, with loopback and the netnshost hosts' network allowed for
// tenants (--tenant-endpoint-allowed-cidrs=127.0.0.0/8,::1,198.18.0.0/15),
// and the netnshost hosts' network for their downloads, where those hosts
// stand for public mirrors (--tenant-content-allowed-cidrs=198.18.0.0/15).
var LoopbackAllowed = netguard.New(netguard.Options{Allowed: []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netnshost.Net,
}, ContentAllowed: []netip.Prefix{netnshost.Net}})

// Env is the provider's controllers running on a control plane, until the
// test ends.
type Env struct {
	// Kube is an admin client of the control plane (not the manager's:
	// reads go to the API server).
	Kube client.Client
	// ControlPlane is the control plane the controllers run on.
	ControlPlane *controlplane.ControlPlane
	// Scheme knows every kind the provider reads and writes.
	Scheme *runtime.Scheme
	// Logs is everything the controllers log, at every verbosity; with
	// EGRESSPROXY_TEST_LOG set it also goes to stderr.
	Logs *testenv.Buffer
	// Ctx ends when the test does, before the manager is waited for.
	Ctx context.Context
	// Timeout bounds each wait of the Env; a test on a slow backend (a
	// real node) raises it.
	Timeout time.Duration
}

// Start runs the provider's controllers for t: a control plane (or
// o.Cluster), the namespaces and objects of o, and the manager, stopped
// when t ends (an error it returns fails t).
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	cp := o.Cluster
	if cp == nil {
		cp, _ = testenv.Start(t, o.ControlPlane)
	}
	s, err := pcontroller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{ControlPlane: cp, Scheme: s, Logs: o.Logs, Timeout: or(o.Timeout, 30*time.Second)}

	if e.Logs == nil {
		e.Logs = &testenv.Buffer{}
	}

	mo := pcontroller.ManagerOptions(s, time.Hour)
	mo.Metrics = metricsserver.Options{BindAddress: "0"}
	// Tests start more than one provider in a process: controller names
	// repeat.
	mo.Controller = ctrlconfig.Controller{SkipNameValidation: ptr.To(true)}
	mgr, err := ctrl.NewManager(cp.Config, mo)
	if err != nil {
		t.Fatal(err)
	}
	if err := pcontroller.AddEventBroadcaster(mgr, mo); err != nil {
		t.Fatal(err)
	}
	// Events wait while resources are written (events.DefaultMaxHold), as
	// in the provider, but a test waiting for one waits seconds, not a
	// minute, while its other resources converge.
	pcontroller.EventBroadcaster(mo).MaxHold = 5 * time.Second

	ctrl.SetLogger(logr.Discard())
	w := zapcore.AddSync(e.Logs)
	if os.Getenv("EGRESSPROXY_TEST_LOG") != "" {
		w = zapcore.NewMultiWriteSyncer(w, zapcore.AddSync(os.Stderr))
		ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr)))
	}
	log := logging.NewLogrLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(w), zap.Level(zapcore.Level(-5))))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the provider's last log lines:\n%s", tail(e.Logs.String(), 60))
		}
	})

	features := &feature.Flags{}
	features.Enable(feature.EnableBetaManagementPolicies)
	eo := external.Options{
		Options: controller.Options{
			Logger:                  log,
			GlobalRateLimiter:       ratelimiter.NewGlobal(100),
			PollInterval:            or(o.PollInterval, time.Minute),
			MaxConcurrentReconciles: or(o.MaxConcurrentReconciles, 4),
			Features:                features,
		},
		InstallationID:       or(o.InstallationID, "test-install"),
		Events:               pcontroller.EventBroadcaster(mo),
		Namespace:            Namespace,
		NotReadyPollInterval: or(o.NotReadyPollInterval, 300*time.Millisecond),
		TenantGuard:          o.TenantGuard,
	}
	if eo.TenantGuard == nil {
		eo.TenantGuard = LoopbackAllowed
	}
	bindings := o.Bindings
	if bindings == nil {
		bindings = pcontroller.Bindings
	}
	ho := o.Health
	ho.Interval, ho.Timeout = or(ho.Interval, time.Minute), or(ho.Timeout, 10*time.Second)
	if err := pcontroller.SetupBindings(mgr, eo, ho, bindings(mgr, eo)...); err != nil {
		t.Fatal(err)
	}

	if e.Kube, err = client.New(cp.Config, client.Options{Scheme: s}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.Ctx = ctx
	for _, ns := range append([]string{Namespace}, o.Namespaces...) {
		e.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	e.Create(t, o.Objects...)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return e
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Create creates objs, in order, failing t on an error.
func (e *Env) Create(t testing.TB, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := e.Kube.Create(context.Background(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, client.ObjectKeyFromObject(o), err)
		}
	}
}

// WaitFor is testenv.WaitFor within the Env's timeout.
func (e *Env) WaitFor(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	testenv.WaitFor(t, what, e.Timeout, cond)
}

// Conditioned is an object with Crossplane conditions: a managed resource
// or a ProviderConfig.
type Conditioned interface {
	client.Object
	GetCondition(xpv2.ConditionType) xpv2.Condition
}

// WaitForCondition waits until obj (read again into obj) has condition ct
// with status and a message containing msg, and returns the condition.
func (e *Env) WaitForCondition(t testing.TB, obj Conditioned, ct xpv2.ConditionType, status corev1.ConditionStatus, msg string) xpv2.Condition {
	t.Helper()
	var c xpv2.Condition
	e.WaitFor(t, fmt.Sprintf("%s %s=%s with %q", obj.GetName(), ct, status, msg), func() (bool, string) {
		if err := e.Kube.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, err.Error()
		}
		c = obj.GetCondition(ct)
		return c.Status == status && strings.Contains(c.Message, msg), fmt.Sprintf("%s=%s %s: %s", ct, c.Status, c.Reason, c.Message)
	})
	return c
}

// WaitReady waits until obj is Ready and Synced.
func (e *Env) WaitReady(t testing.TB, obj Conditioned) {
	t.Helper()
	e.WaitFor(t, obj.GetName()+" to be Ready and Synced", func() (bool, string) {
		if err := e.Kube.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, err.Error()
		}
		r, s := obj.GetCondition(xpv2.TypeReady), obj.GetCondition(xpv2.TypeSynced)
		return r.Status == corev1.ConditionTrue && s.Status == corev1.ConditionTrue,
			fmt.Sprintf("Ready=%s %q, Synced=%s %q", r.Status, r.Message, s.Status, s.Message)
	})
}

// WaitGone waits until obj no longer exists; seen, when given, adds to
// what a timeout reports (what is left of it, say).
func (e *Env) WaitGone(t testing.TB, obj Conditioned, seen ...func() string) {
	t.Helper()
	e.WaitFor(t, obj.GetName()+" to be gone", func() (bool, string) {
		err := e.Kube.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
		if kerrors.IsNotFound(err) {
			return true, ""
		}
		s := obj.GetCondition(xpv2.TypeSynced)
		msg := fmt.Sprintf("%v; finalizers %v; Synced=%s %q", err, obj.GetFinalizers(), s.Status, s.Message)
		for _, f := range seen {
			msg += "; " + f()
		}
		return false, msg
	})
}

// Delete deletes obj and waits until it is gone; see WaitGone.
func (e *Env) Delete(t testing.TB, obj Conditioned, seen ...func() string) {
	t.Helper()
	if err := e.Kube.Delete(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
	e.WaitGone(t, obj, seen...)
}

// Update reads obj, applies mutate to it and writes it, again while the
// write conflicts with another writer's (the controllers write status).
func (e *Env) Update(t testing.TB, obj client.Object, mutate func()) {
	t.Helper()
	for range 20 {
		if err := e.Kube.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		mutate()
		err := e.Kube.Update(context.Background(), obj)
		if err == nil {
			return
		}
		if !kerrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
	t.Fatalf("updating %s: 20 conflicts in a row", obj.GetName())
}

// ConnectionSecret waits for the connection Secret namespace/name to hold
// a URL and a host other than notHost (a rollout gives a pod proxy a new
// address; "" takes any), and returns its data.
func (e *Env) ConnectionSecret(t testing.TB, namespace, name, notHost string) map[string]string {
	t.Helper()
	var out map[string]string
	e.WaitFor(t, "connection Secret "+namespace+"/"+name, func() (bool, string) {
		s := &corev1.Secret{}
		if err := e.Kube.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, s); err != nil {
			return false, err.Error()
		}
		out = map[string]string{}
		for k, v := range s.Data {
			out[k] = string(v)
		}
		return out["url"] != "" && out["host"] != notHost, fmt.Sprintf("host %q, %d keys", out["host"], len(out))
	})
	return out
}

// Events are the events recorded about the object namespace/name.
func (e *Env) Events(t testing.TB, namespace, name string) []corev1.Event {
	t.Helper()
	l := &corev1.EventList{}
	if err := e.Kube.List(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range l.Items {
		if ev.InvolvedObject.Name == name && ev.InvolvedObject.Namespace == namespace {
			out = append(out, ev)
		}
	}
	return out
}

// WaitEvent waits for an event about namespace/name of type typ with
// reason and a message starting with msgPrefix.
func (e *Env) WaitEvent(t testing.TB, namespace, name, typ, reason, msgPrefix string) {
	t.Helper()
	e.WaitFor(t, fmt.Sprintf("a %s event %s %q on %s", typ, reason, msgPrefix, name), func() (bool, string) {
		var seen []string
		for _, ev := range e.Events(t, namespace, name) {
			if ev.Type == typ && ev.Reason == reason && strings.HasPrefix(ev.Message, msgPrefix) {
				return true, ""
			}
			seen = append(seen, ev.Type+" "+ev.Reason+" "+ev.Message)
		}
		return false, strings.Join(seen, "; ")
	})
}

// ManagedSpec is the spec every namespaced managed resource of the tests
// starts from: on the ClusterProviderConfig config, its connection Secret
// written to secret in its own namespace ("" writes none).
func ManagedSpec(config, secret string) xpv2.ManagedResourceSpec {
	s := xpv2.ManagedResourceSpec{ProviderConfigReference: &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: config}}
	if secret != "" {
		s.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: secret}
	}
	return s
}

// ClusterManagedSpec is that of a cluster-scoped managed resource: on the
// cluster-scoped ProviderConfig config, its connection Secret written to
// secret in Namespace.
func ClusterManagedSpec(config, secret string) xpv2.ClusterManagedResourceSpec {
	return xpv2.ClusterManagedResourceSpec{
		ProviderConfigReference:          &xpv2.Reference{Name: config},
		WriteConnectionSecretToReference: &xpv2.SecretReference{Namespace: Namespace, Name: secret},
	}
}

// RequireSquid returns the path of the squid binary (see
// kubelettest.SquidPath); without one the test skips, or fails under CI
// or with EGRESSPROXY_REQUIRE_SQUID=1.
func RequireSquid(t testing.TB) string {
	t.Helper()
	p, err := kubelettest.SquidPath("")
	if err == nil {
		return p
	}
	if testenv.CI() || os.Getenv("EGRESSPROXY_REQUIRE_SQUID") == "1" {
		t.Fatalf("%v (CI or EGRESSPROXY_REQUIRE_SQUID=1 is set, so this test does not skip)", err)
	}
	t.Skip(err.Error())
	return ""
}

// StartKubelet runs the kubelet stand-in on the Env's control plane until
// t ends: every pod of the cluster runs as a real squid process (squid,
// from RequireSquid), its files in dir ("" for a folder of its own). What
// the stand-in logs is shown when t fails.
func (e *Env) StartKubelet(t testing.TB, squid, dir string) *kubelettest.Kubelet {
	t.Helper()
	klog := &testenv.Buffer{}
	k, err := kubelettest.New(e.ControlPlane.Config, kubelettest.Options{Mode: kubelettest.Squid, SquidPath: squid, Log: klog, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Run(e.Ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		k.Stop()
		if t.Failed() {
			t.Logf("kubelet stand-in:\n%s", klog.String())
		}
	})
	return k
}

// DeleteNamespace deletes namespace ns as kubectl delete namespace does
// (the kube-controller-manager's namespace controller, which the control
// plane must run, deletes what it holds) and waits until it is gone,
// within timeout; see WaitNamespaceGone.
func (e *Env) DeleteNamespace(t testing.TB, ns string, timeout time.Duration) {
	t.Helper()
	if err := e.Kube.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	e.WaitNamespaceGone(t, ns, timeout)
}

// WaitNamespaceGone waits until namespace ns is gone, within timeout. A
// timeout reports what is left in it: each object of the provider's kinds
// and Secrets, with its finalizers and, for a managed resource, its
// Synced condition.
func (e *Env) WaitNamespaceGone(t testing.TB, ns string, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, "namespace "+ns+" to be gone", timeout, func() (bool, string) {
		n := &corev1.Namespace{}
		err := e.Kube.Get(context.Background(), types.NamespacedName{Name: ns}, n)
		if kerrors.IsNotFound(err) {
			return true, ""
		}
		return false, fmt.Sprintf("%v; phase %s; left: %s", err, n.Status.Phase, strings.Join(e.left(t, ns), "; "))
	})
}

// WaitSwept waits until the namespace controller has been through
// namespace ns (being deleted): every object of the provider's kinds and
// every Secret in it is gone or being deleted. A test that holds its
// proxies' deletion on the backend releases it then, so the proxies'
// Delete runs after everything else of the namespace was deleted, the
// order that needs the most.
func (e *Env) WaitSwept(t testing.TB, ns string, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, "the namespace controller to delete everything in "+ns, timeout, func() (bool, string) {
		var live []string
		for _, o := range e.objectsIn(t, ns) {
			if o.GetDeletionTimestamp() == nil {
				live = append(live, fmt.Sprintf("%T %s", o, o.GetName()))
			}
		}
		return len(live) == 0, "not deleted yet: " + strings.Join(live, ", ")
	})
}

// left lists the objects of the provider's kinds and the Secrets in ns,
// with their finalizers and, for a managed resource, its Synced message.
func (e *Env) left(t testing.TB, ns string) []string {
	t.Helper()
	var out []string
	for _, o := range e.objectsIn(t, ns) {
		s := fmt.Sprintf("%s %s finalizers %v", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), o.GetFinalizers())
		if c, ok := o.(Conditioned); ok {
			if sc := c.GetCondition(xpv2.TypeSynced); sc.Message != "" {
				s += fmt.Sprintf(" Synced=%s %q", sc.Status, sc.Message)
			}
		}
		out = append(out, s)
	}
	return out
}

// objectsIn lists the objects of the provider's namespaced kinds and the
// Secrets in ns.
func (e *Env) objectsIn(t testing.TB, ns string) []client.Object {
	t.Helper()
	var out []client.Object
	for gvk := range e.Scheme.AllKnownTypes() {
		if !strings.HasSuffix(gvk.Kind, "List") || !(strings.Contains(gvk.Group, "egressproxy.io") || (gvk.Group == "" && gvk.Kind == "SecretList")) {
			continue
		}
		o, err := e.Scheme.New(gvk)
		if err != nil {
			continue
		}
		l, ok := o.(client.ObjectList)
		if !ok {
			continue
		}
		if err := e.Kube.List(context.Background(), l, client.InNamespace(ns)); err != nil {
			continue
		}
		kind := gvk.GroupVersion().WithKind(strings.TrimSuffix(gvk.Kind, "List"))
		_ = apimeta.EachListItem(l, func(o runtime.Object) error {
			co, ok := o.(client.Object)
			if !ok || co.GetNamespace() == "" {
				return nil
			}
			co.GetObjectKind().SetGroupVersionKind(kind)
			out = append(out, co)
			return nil
		})
	}
	return out
}

// WaitProtected waits until the namespaced ProviderConfig ns/config and
// the Secrets it reads carry the finalizers that keep them for the Delete
// of the resources that name it.
func (e *Env) WaitProtected(t testing.TB, ns, config string, secrets ...string) {
	t.Helper()
	e.WaitFor(t, "ProviderConfig "+ns+"/"+config+" and its Secrets to be protected", func() (bool, string) {
		var seen []string
		pc := &nsv1alpha1.ProviderConfig{}
		if err := e.Kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: config}, pc); err != nil {
			return false, err.Error()
		}
		if !slices.Contains(pc.Finalizers, pconfig.InUseFinalizer) {
			seen = append(seen, fmt.Sprintf("ProviderConfig %s finalizers %v", config, pc.Finalizers))
		}
		for _, name := range secrets {
			s := &corev1.Secret{}
			if err := e.Kube.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, s); err != nil {
				return false, err.Error()
			}
			if !slices.Contains(s.Finalizers, pconfig.SecretFinalizer(config)) {
				seen = append(seen, fmt.Sprintf("Secret %s finalizers %v", name, s.Finalizers))
			}
		}
		return len(seen) == 0, strings.Join(seen, "; ")
	})
}

// CheckNoFinalizerLeft fails t when an object of the provider's kinds or
// a Secret in namespace ns (one that outlives the tenants' namespaces,
// such as the provider's own) carries a finalizer of the provider's.
func (e *Env) CheckNoFinalizerLeft(t testing.TB, ns string) {
	t.Helper()
	for _, l := range e.left(t, ns) {
		if strings.Contains(l, "egressproxy.io/") {
			t.Errorf("in namespace %s: %s", ns, l)
		}
	}
}
