// Package health runs each ProviderConfig's backend check periodically and
// writes the outcome into the config's status: a Healthy condition and the
// health of each target (host, node, project, API server).
package health

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	configctl "github.com/egressproxy/provider-egressproxy/internal/controller/config"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Condition types written by the health controller.
const (
	// TypeHealthy is True when every target of the backend passed its check.
	TypeHealthy xpv2.ConditionType = "Healthy"
	// TypeSecure is False when the config turns off host-key or TLS
	// verification.
	TypeSecure xpv2.ConditionType = "Secure"
)

// Condition reasons written by the health controller.
const (
	ReasonHealthy       xpv2.ConditionReason = "Healthy"
	ReasonUnhealthy     xpv2.ConditionReason = "Unhealthy"
	ReasonCannotConnect xpv2.ConditionReason = "CannotConnect"
	// ReasonIdentityNotAllowed: a namespaced config asks for the
	// provider's own identity.
	ReasonIdentityNotAllowed xpv2.ConditionReason = "IdentityNotAllowed"
	ReasonVerified           xpv2.ConditionReason = "Verified"
	ReasonVerificationTurned xpv2.ConditionReason = "VerificationOff"
)

// config is the part of the three config kinds the controller needs.
type config interface {
	client.Object
	SetConditions(c ...xpv2.Condition)
}

// Reconciler checks one config kind.
type Reconciler struct {
	Kube client.Client
	// Configs resolves configs, and their backends (ConfigReader.Backends)
	// build the drivers, as the kinds do.
	Configs  external.ConfigReader
	Interval time.Duration
	Timeout  time.Duration
	// Workers is how many configs of one kind are checked at once
	// (DefaultWorkers when 0): a config whose hosts do not answer holds
	// one worker until Timeout, never every check of every other config.
	Workers int
	Log     logging.Logger
	// Events records every change of a config's Healthy and Secure
	// conditions; Setup gives each config kind its own.
	Events    event.Recorder
	kind      string
	newConfig func() config
	status    func(config) *spec.ProviderConfigStatus
	recorded  *transitions
	// stalls keeps one namespace's silent configs from holding every
	// worker: while their checks stall they get a quarter of them.
	stalls *external.CheckGuard
}

// transitions remembers the last change recorded of each config's
// conditions, so that a check that read its config before the cache held
// the previous check's write does not record the same change again.
type transitions struct {
	mu   sync.Mutex
	last map[types.NamespacedName]map[xpv2.ConditionType]string
}

// repeat reports whether is was the last change recorded of pc's
// condition, and remembers it as the last one otherwise.
func (t *transitions) repeat(pc config, is xpv2.Condition) bool {
	key := types.NamespacedName{Namespace: pc.GetNamespace(), Name: pc.GetName()}
	now := string(pc.GetUID()) + "/" + string(is.Status) + "/" + string(is.Reason)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last = map[types.NamespacedName]map[xpv2.ConditionType]string{}
	}
	if t.last[key] == nil {
		t.last[key] = map[xpv2.ConditionType]string{}
	}
	if t.last[key][is.Type] == now {
		return true
	}
	t.last[key][is.Type] = now
	return false
}

// forget drops what is remembered of a config that is gone.
func (t *transitions) forget(key types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.last, key)
}

// DefaultWorkers is Reconciler.Workers when unset.
const DefaultWorkers = 8

// Setup registers a health controller for each config kind in gvks.
func Setup(mgr ctrl.Manager, r Reconciler, log logging.Logger, gvks ...schema.GroupVersionKind) error {
	for _, gvk := range gvks {
		rr := r
		rr.Log = log.WithValues("controller", "health/"+strings.ToLower(gvk.Kind))
		rr.newConfig = configctl.NewFunc[config](mgr, gvk)
		rr.status = statusOf
		rr.kind = gvk.Kind
		rr.recorded = &transitions{}
		if rr.Events == nil {
			rr.Events = event.NewAPIRecorder(mgr.GetEventRecorderFor("health/" + strings.ToLower(gvk.GroupKind().String())))
		}
		workers := rr.Workers
		if workers <= 0 {
			workers = DefaultWorkers
		}
		rr.stalls = external.NewCheckGuard(workers/4, clock.RealClock{})
		if err := configctl.SetupPeriodic(mgr, "health/"+strings.ToLower(gvk.GroupKind().String()), rr.newConfig(), workers, &rr); err != nil {
			return errors.Wrapf(err, "cannot set up the health controller of %s", gvk.Kind)
		}
	}
	return nil
}

// Reconcile checks one config and requeues itself after the interval.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pc := r.newConfig()
	if live, err := configctl.GetLive(ctx, r.Kube, req.NamespacedName, pc, func() {
		telemetry.ForgetConfig(r.kind, req.Namespace, req.Name, nil)
		if r.recorded != nil {
			r.recorded.forget(req.NamespacedName)
		}
	}); !live {
		return reconcile.Result{}, err
	}
	cfg := r.Configs.Of(pc)
	status := r.status(pc)
	was := map[xpv2.ConditionType]xpv2.Condition{TypeHealthy: status.GetCondition(TypeHealthy), TypeSecure: status.GetCondition(TypeSecure)}
	oldTargets := make([]string, 0, len(status.Targets))
	for _, t := range status.Targets {
		oldTargets = append(oldTargets, t.Target)
	}
	backend := cfg.BackendName()
	status.Backend = backend
	status.InstallationID = cfg.InstallationID
	pc.SetConditions(secureCondition(cfg))
	if insecure := secureCondition(cfg); insecure.Status == corev1.ConditionFalse {
		r.Log.Info("WARNING: "+insecure.Message, "config", cfg.Name)
	}

	end, err := r.stalls.Enter(cfg, pc.GetNamespace())
	if err != nil {
		// Checked once one of the namespace's stalled checks ends; the
		// status keeps the last check's outcome and time meanwhile.
		r.Log.Debug("config check deferred", "config", cfg.Name, "error", err.Error())
		return reconcile.Result{RequeueAfter: jitter(r.Timeout)}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	ctx, span := telemetry.Tracer().Start(ctx, "egressproxy.CheckConfig", trace.WithAttributes(
		attribute.String("egressproxy.provider_config", cfg.Name), attribute.String("egressproxy.backend", backend)))
	h := func() proxy.Health {
		// Deferred: a check that panics still leaves the guard.
		defer end()
		return r.check(ctx, cfg)
	}()
	if !h.Healthy() {
		span.SetStatus(codes.Error, "unhealthy")
	}
	span.End()

	now := metav1.Now()
	status.LastCheckTime = &now
	status.Targets = make([]spec.TargetHealth, 0, len(h.Targets))
	var bad []string
	for _, t := range h.Targets {
		status.Targets = append(status.Targets, spec.TargetHealth{
			Target: t.Target, Address: t.Address, Healthy: t.Healthy, Reason: t.Reason, Message: t.Message, Details: t.Details,
		})
		if !t.Healthy {
			bad = append(bad, fmt.Sprintf("%s: %s: %s", t.Target, t.Reason, t.Message))
		}
	}
	if h.Healthy() {
		pc.SetConditions(xpv2.Condition{Type: TypeHealthy, Status: corev1.ConditionTrue, Reason: ReasonHealthy, LastTransitionTime: now,
			Message: fmt.Sprintf("%d of %d targets healthy", len(h.Targets), len(h.Targets))})
	} else {
		reason := ReasonUnhealthy
		if len(h.Targets) == 1 && h.Targets[0].Reason == proxy.ReasonNotAvailable {
			reason = ReasonCannotConnect
		}
		if len(h.Targets) == 1 && h.Targets[0].Reason == string(ReasonIdentityNotAllowed) {
			reason = ReasonIdentityNotAllowed
		}
		pc.SetConditions(xpv2.Condition{Type: TypeHealthy, Status: corev1.ConditionFalse, Reason: reason, LastTransitionTime: now,
			Message: strings.Join(bad, "; ")})
	}
	gone := slices.DeleteFunc(oldTargets, func(old string) bool {
		return slices.ContainsFunc(h.Targets, func(t proxy.TargetHealth) bool { return t.Target == old })
	})
	telemetry.ForgetConfig(r.kind, pc.GetNamespace(), pc.GetName(), gone)
	for _, t := range h.Targets {
		telemetry.ConfigTargetHealthy.WithLabelValues(r.kind, pc.GetNamespace(), pc.GetName(), backend, t.Target).Set(boolGauge(t.Healthy))
	}
	if err := r.writeStatus(ctx, pc, status); err != nil {
		return reconcile.Result{}, err
	}
	for _, ct := range []xpv2.ConditionType{TypeHealthy, TypeSecure} {
		r.recordTransition(pc, was[ct], status.GetCondition(ct))
	}
	return reconcile.Result{RequeueAfter: jitter(r.Interval)}, nil
}

// writeStatus writes the status fields the health check owns with a merge
// patch of the status subresource: it needs no resourceVersion, so it
// never conflicts with the usage controller's or the orphan sweep's
// writes of their own fields in between. Every field is sent, empty ones
// too, so that nothing of an earlier check stays.
func (r *Reconciler) writeStatus(ctx context.Context, pc config, status *spec.ProviderConfigStatus) error {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"conditions":     status.Conditions,
		"backend":        status.Backend,
		"installationID": status.InstallationID,
		"lastCheckTime":  status.LastCheckTime,
		"targets":        status.Targets,
	}})
	if err != nil {
		return err
	}
	return errors.Wrap(client.IgnoreNotFound(r.Kube.Status().Patch(ctx, pc, client.RawPatch(types.MergePatchType, patch))), "cannot update the config's status")
}

// check runs the backend's Check; a config whose driver cannot be built is
// one unhealthy target saying why.
func (r *Reconciler) check(ctx context.Context, cfg *external.Config) proxy.Health {
	backend := cfg.BackendName()
	// Before any credential is read: a namespaced config never gets to
	// use the provider's own identity, not even for a health check.
	if err := cfg.CheckTenancy(); err != nil {
		return proxy.Health{Targets: []proxy.TargetHealth{{Target: backend, Reason: string(ReasonIdentityNotAllowed), Message: err.Error()}}}
	}
	if cfg.Backend == nil {
		return proxy.Health{Targets: []proxy.TargetHealth{{Target: backend, Reason: proxy.ReasonNotAvailable,
			Message: fmt.Sprintf("the %s backend is not available in this build of provider-egressproxy", backend)}}}
	}
	d, err := cfg.Backend.Connect(ctx, cfg)
	if err != nil {
		reason := proxy.ReasonNotAvailable
		if proxy.IsTransient(err) {
			reason = proxy.ReasonCredentialsUnavailable
		}
		return proxy.Health{Targets: []proxy.TargetHealth{{Target: backend, Reason: reason, Message: err.Error()}}}
	}
	return telemetry.Instrument(backend, d).Check(ctx)
}

// secureCondition is False when the config's block turns a verification
// off (Block.Insecure says which).
func secureCondition(cfg *external.Config) xpv2.Condition {
	c := xpv2.Condition{Type: TypeSecure, Status: corev1.ConditionTrue, Reason: ReasonVerified, LastTransitionTime: metav1.Now()}
	if cfg.Backend == nil {
		return c
	}
	if b, _ := cfg.Backend.Block(&cfg.Spec); b.Insecure != "" {
		c.Status, c.Reason, c.Message = corev1.ConditionFalse, ReasonVerificationTurned, b.Insecure
	}
	return c
}

// recordTransition records an event when a condition changed status or
// reason: Normal when it became True, Warning otherwise. A config's first
// Secure=True is no news and records nothing.
func (r *Reconciler) recordTransition(pc config, was, is xpv2.Condition) {
	if was.Status == is.Status && was.Reason == is.Reason {
		return
	}
	if was.Status == corev1.ConditionUnknown && was.Reason == "" && is.Type == TypeSecure && is.Status == corev1.ConditionTrue {
		return
	}
	if r.recorded != nil && r.recorded.repeat(pc, is) {
		return
	}
	e := event.Event{Type: event.TypeWarning, Reason: event.Reason(is.Reason),
		Message: fmt.Sprintf("%s is now %s (was %s)", is.Type, is.Status, was.Status)}
	if is.Status == corev1.ConditionTrue {
		e.Type = event.TypeNormal
	}
	if is.Message != "" {
		e.Message += ": " + is.Message
	}
	r.Events.Event(pc, e)
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.2-0.1)*float64(d)) //nolint:gosec // Jitter needs no secure randomness.
}

func statusOf(c config) *spec.ProviderConfigStatus {
	type statused interface {
		ConfigStatus() *spec.ProviderConfigStatus
	}
	return c.(statused).ConfigStatus() //nolint:forcetypeassert // Every config kind has one.
}
