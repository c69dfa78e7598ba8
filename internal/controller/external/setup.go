package external

import (
	"context"
	"maps"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/config"
	"github.com/egressproxy/provider-egressproxy/internal/controller/events"
	"github.com/egressproxy/provider-egressproxy/internal/controller/writes"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Options configure every proxy controller.
type Options struct {
	controller.Options
	// InstallationID is the provider's own installation ID, used by configs
	// that set none.
	InstallationID string
	// Namespace is the provider's namespace (for its password key).
	Namespace string
	// NotReadyPollInterval is how soon a resource that is not Ready yet is
	// looked at again; Ready resources wait Options.PollInterval.
	NotReadyPollInterval time.Duration
	// PollJitter is the maximum jitter added to or taken from each poll.
	PollJitter time.Duration
	// QuotaRetryInterval is how long a proxy whose backend answered out
	// of quota or capacity waits before the next attempt
	// (DefaultQuotaRetryInterval when 0); a backend's Retry-After, when
	// longer, is waited instead.
	QuotaRetryInterval time.Duration
	// AllWrites turns the write-eliding client (package writes) off: the
	// managed reconcilers then send every write crossplane-runtime makes
	// and read connection Secrets from the API server.
	AllWrites bool
	// Events, when set, is the manager's event broadcaster: its events
	// wait while the managed resources are being written.
	Events *events.Broadcaster
	// TenantGuard is the dialer of every endpoint a namespaced
	// ProviderConfig names (cmd/provider's --tenant-endpoint-* flags and
	// the cluster's discovered networks); nil refuses the defaults.
	TenantGuard *netguard.Guard
	// ClusterNetworks are the networks the provider's own cluster says
	// are its own, read once for the tenant guard and the PodProxies in
	// that cluster (netguard.Discovery.Cluster); nil: the PodProxy
	// drivers read them themselves.
	ClusterNetworks netguard.Networks
}

// Shared is what every kind's controllers share: one password generator,
// and one client for the managed reconcilers (its record of what the API
// server holds spans every kind).
type Shared struct {
	Passwords *Passwords
	// Client is what the managed reconcilers read and write with: a
	// writes.Client unless Options.AllWrites.
	Client client.Client
	// reconcilerManager is the manager as the managed reconcilers see it.
	reconcilerManager func(ctrl.Manager) ctrl.Manager
}

// NewShared returns the state shared by every kind's controllers. Unless
// o.AllWrites, it adds a watch of connection Secrets to mgr for the
// managed reconcilers' client; if that cannot be built, connection Secrets
// are read from the API server.
func NewShared(mgr ctrl.Manager, o Options) *Shared {
	sh := &Shared{
		Passwords:         &Passwords{Kube: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: o.Namespace},
		Client:            mgr.GetClient(),
		reconcilerManager: func(m ctrl.Manager) ctrl.Manager { return m },
	}
	if o.AllWrites {
		sh.reconcilerManager = func(m ctrl.Manager) ctrl.Manager { return writes.RemovingStaleKeys(m, spec.ConnectionKeys) }
		sh.Client = sh.reconcilerManager(mgr).GetClient()
		return sh
	}
	var secrets client.Reader
	var synced func() bool
	if c, err := writes.ConnectionSecretCache(mgr.GetConfig(), mgr.GetScheme()); err != nil {
		o.Logger.Info("cannot watch connection Secrets; reading them from the API server", "error", err.Error())
	} else if i, err := c.GetInformer(context.Background(), &corev1.Secret{}, cache.BlockUntilSynced(false)); err != nil {
		o.Logger.Info("cannot watch connection Secrets; reading them from the API server", "error", err.Error())
	} else if err := mgr.Add(c); err != nil {
		o.Logger.Info("cannot watch connection Secrets; reading them from the API server", "error", err.Error())
	} else {
		secrets, synced = c, i.HasSynced
	}
	wc := writes.NewClient(mgr.GetClient(), secrets, synced)
	wc.ConnectionKeys = spec.ConnectionKeys
	if o.Events != nil {
		// The managed resources' writes go before the events.
		wc.OnWrite = o.Events.NoteWrite
	}
	sh.Client, sh.reconcilerManager = wc, wc.Manager
	return sh
}

// ReconcilerManager is mgr as crossplane-runtime's reconcilers should see
// it: with Shared.Client as its client (the runtime takes its client from
// the manager and has no option to set it).
func (sh *Shared) ReconcilerManager(mgr ctrl.Manager) ctrl.Manager {
	return sh.reconcilerManager(mgr)
}

// Setup registers kind k's controller once for each of k.GVKs.
func Setup[P any](mgr ctrl.Manager, o Options, sh *Shared, k Kind[P]) error {
	c := &connector[P]{
		kube:      sh.Client,
		kind:      k,
		configs:   ConfigReader{Kube: mgr.GetClient(), SecretReader: mgr.GetAPIReader(), InstallationID: o.InstallationID, Backends: []Backend{k.Backend}, Guard: o.TenantGuard},
		secrets:   Secrets{Kube: mgr.GetAPIReader()},
		passwords: sh.Passwords,
		modern:    resource.NewProviderConfigUsageTracker(mgr.GetClient(), &namespacedv1alpha1.ProviderConfigUsage{}),
		legacy:    resource.NewLegacyProviderConfigUsageTracker(mgr.GetClient(), &clusterv1alpha1.ProviderConfigUsage{}),
		record:    event.NewAPIRecorder(mgr.GetEventRecorderFor("egressproxy/" + strings.ToLower(k.Name))),
		hints:     newRetryHints(o.QuotaRetryInterval),
		protect:   (&config.Protector{Kube: mgr.GetClient(), Secrets: mgr.GetAPIReader()}).Ensure,
		egress:    &squid.EgressChecker{},
		stalls:    newStallGuard(),
	}
	for _, gvk := range k.GVKs {
		if o.Gate != nil {
			// Safe start: the controller starts once Crossplane has
			// activated the kind (its CRD exists and is established).
			o.Gate.Register(func() {
				if err := setupScope(mgr, o, sh, k, c, gvk); err != nil {
					o.Logger.Info("cannot set up a controller", "kind", gvk.GroupKind().String(), "error", err.Error())
				}
			}, gvk)
			continue
		}
		if err := setupScope(mgr, o, sh, k, c, gvk); err != nil {
			return errors.Wrapf(err, "cannot set up the %s controller", gvk.GroupKind())
		}
	}
	return nil
}

func setupScope[P any](mgr ctrl.Manager, o Options, sh *Shared, k Kind[P], c *connector[P], gvk schema.GroupVersionKind) error {
	name := managed.ControllerName(gvk.GroupKind().String())
	obj, err := mgr.GetScheme().New(gvk)
	if err != nil {
		return err
	}
	opts, err := reconcilerOptions(mgr, o, sh, c, gvk, name)
	if err != nil {
		return err
	}
	// The reconciler takes its client (and its default finalizer's and
	// connection publisher's) from the manager: give it Shared.Client,
	// which leaves out writes the server already holds (package writes).
	r := managed.NewReconciler(sh.ReconcilerManager(mgr), resource.ManagedKind(gvk), opts...)

	forObj := obj.(client.Object) //nolint:forcetypeassert // Every registered kind is an object.
	b := ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		WithEventFilter(desiredStateChanged()).
		For(forObj)
	listGVK := gvk.GroupVersion().WithKind(gvk.Kind + "List")
	if _, err := mgr.GetScheme().New(listGVK); err != nil {
		return err
	}
	b = watchConfigs(mgr, b, forObj, func() client.ObjectList {
		l, _ := mgr.GetScheme().New(listGVK)
		return l.(client.ObjectList) //nolint:forcetypeassert // Every registered list kind is a list.
	})
	if k.Watches != nil {
		// The kind's list, for the watches to list into.
		l, err := mgr.GetScheme().New(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err != nil {
			return err
		}
		b = k.Watches(mgr, b, l.(client.ObjectList)) //nolint:forcetypeassert // Every registered list kind is a list.
	}
	return b.Complete(ratelimiter.NewReconciler(name, errors.WithSilentRequeueOnConflict(retryAfter{inner: r, hints: c.hints}), o.GlobalRateLimiter))
}

// reconcilerOptions are the managed reconciler's options for kind gvk's
// controller name; with state metrics on, it adds their recorder to mgr.
func reconcilerOptions[P any](mgr ctrl.Manager, o Options, sh *Shared, c *connector[P], gvk schema.GroupVersionKind, name string) ([]managed.ReconcilerOption, error) {
	opts := []managed.ReconcilerOption{
		managed.WithExternalConnector(c),
		managed.WithInitializers(NameInitializer{Kube: sh.Client}),
		managed.WithFinalizer(childrenFinalizer{Finalizer: resource.NewAPIFinalizer(sh.Client, managed.FinalizerName), kube: sh.Client, release: c.kind.Release}),
		managed.WithCriticalAnnotationUpdater(annotationUpdater{inner: managed.NewRetryingCriticalAnnotationUpdater(sh.Client)}),
		// Names are derived from the resource, so a create interrupted by a
		// crash is safe to resume.
		managed.WithDeterministicExternalName(true),
		// No wait for a new instance to show up: drivers read their
		// backends consistently (an operation in flight is followed through
		// Ref.Operation; a cached read is confirmed live when a miss would
		// end a resource being deleted). A wait would only hold up deleting
		// a new proxy, by the runtime's growing backoff.
		managed.WithCreationGracePeriod(0),
		managed.WithLogger(o.Logger.WithValues("controller", name)),
		managed.WithPollInterval(o.PollInterval),
		managed.WithPollIntervalHook(PollHook(o.NotReadyPollInterval, o.PollJitter)),
		managed.WithRecorder(event.NewAPIRecorder(mgr.GetEventRecorderFor(name))),
		managed.WithManagementPolicies(),
	}
	if o.Features.Enabled(feature.EnableAlphaChangeLogs) && o.ChangeLogOptions != nil {
		opts = append(opts, managed.WithChangeLogger(o.ChangeLogOptions.ChangeLogger))
	}
	if o.MetricOptions != nil {
		opts = append(opts, managed.WithMetricRecorder(o.MetricOptions.MRMetrics))
		if o.MetricOptions.MRStateMetrics != nil {
			obj, err := mgr.GetScheme().New(gvk)
			if err != nil {
				return nil, err
			}
			if mo, ok := obj.(client.Object); ok {
				if err := mgr.Add(newStateRecorder(mgr.GetCache(), mo, gvk, o.MetricOptions.MRStateMetrics, o.MetricOptions.PollStateMetricInterval)); err != nil {
					return nil, err
				}
			}
		}
	}
	return opts, nil
}

// PollHook polls a resource that is not Ready, or whose egress check is
// still out, every notReady, and a Ready one at the configured poll
// interval; both with up to jitter either way (at most a quarter of the
// interval, so that fast polls stay fast) so that resources created
// together do not poll together.
func PollHook(notReady, jitter time.Duration) managed.PollIntervalHook {
	return func(mg resource.Managed, interval time.Duration) time.Duration {
		if (mg.GetCondition(xpv2.TypeReady).Status != corev1.ConditionTrue || mg.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified)).Reason == reasonEgressPending) && notReady > 0 {
			interval = notReady
		}
		jitter := min(jitter, interval/4)
		if jitter <= 0 {
			return interval
		}
		j := time.Duration((rand.Float64()*2 - 1) * float64(jitter)) //nolint:gosec // Jitter needs no secure randomness.
		if interval+j <= 0 {
			return interval
		}
		return interval + j
	}
}

// desiredStateChanged is crossplane-runtime's DesiredStateChanged, except
// that the annotations the managed reconciler writes around Create
// (external-create-pending, -succeeded and -failed) are not a change: the
// reconciler requeues the resource itself after writing them, so the
// event would only reconcile it once more.
func desiredStateChanged() predicate.Predicate {
	return predicate.Or(
		annotationsChanged{ignored: []string{meta.AnnotationKeyExternalCreatePending, meta.AnnotationKeyExternalCreateSucceeded, meta.AnnotationKeyExternalCreateFailed}},
		predicate.LabelChangedPredicate{},
		predicate.GenerationChangedPredicate{},
	)
}

// annotationsChanged passes updates that change an annotation other than
// the ignored ones.
type annotationsChanged struct {
	predicate.Funcs
	ignored []string
}

func (a annotationsChanged) Update(e ctrlevent.UpdateEvent) bool {
	if e.ObjectOld == nil || e.ObjectNew == nil {
		return false
	}
	o, n := maps.Clone(e.ObjectOld.GetAnnotations()), maps.Clone(e.ObjectNew.GetAnnotations())
	for _, k := range a.ignored {
		delete(o, k)
		delete(n, k)
	}
	return !maps.Equal(o, n)
}
