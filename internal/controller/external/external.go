package external

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/config"
	"github.com/egressproxy/provider-egressproxy/internal/controller/writes"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

const (
	defaultPort     = 3128
	defaultUsername = "proxy"
)

type connector[P any] struct {
	kube      client.Client
	kind      Kind[P]
	configs   ConfigReader
	secrets   Secrets
	passwords *Passwords
	modern    resource.ModernTracker
	legacy    resource.LegacyTracker
	// record gets an event for every change of a proxy's Ready condition.
	record event.Recorder
	// hints carry a failed reconcile's wait to retryAfter.
	hints *retryHints
	// protect protects a namespaced config and its Secrets for the
	// Delete of the resources that name it (config.Protector.Ensure).
	protect func(context.Context, *namespacedv1alpha1.ProviderConfig) error
	// egress sends the egress checks of the kind's proxies.
	egress *squid.EgressChecker
	// stalls keeps a config whose backend stops answering from holding
	// the kind's workers; nil lets every call through.
	stalls *stallGuard
}

// Connect tracks the config's usage, resolves the config, checks that it
// holds this kind's backend block, and builds the driver. It runs on every
// reconcile, so changed configs and rotated credentials apply at once.
func (c *connector[P]) Connect(ctx context.Context, mg resource.Managed) (managed.ExternalClient, error) {
	cr, ok := mg.(Resource[P])
	if !ok {
		return nil, errors.Errorf("%T is not a %s", mg, c.kind.Name)
	}
	if err := c.track(ctx, mg); err != nil {
		return nil, err
	}
	cfg, err := c.configs.Resolve(ctx, mg)
	if err != nil {
		return unconnected(ctx, cr, err)
	}
	b := c.kind.Backend
	if cfg.Backend == nil || cfg.Backend.Name != b.Name {
		return unconnected(ctx, cr, errors.Errorf("%s holds a %s block, but a %s needs a config with a %s block: point spec.providerConfigRef at one", cfg.Name, cfg.BackendName(), c.kind.Name, b.Name))
	}
	// What deletes the instance is protected before there is one: the
	// config's Protector would do it within a second, a namespace deleted
	// in that second would take the config's Secrets with it. A resource
	// being deleted goes on unprotected: nothing may stop its Delete.
	if pc := cfg.namespacedConfig; pc != nil && !meta.WasDeleted(mg) && c.protect != nil {
		if !config.Protected(pc) {
			if err := c.protect(ctx, pc); err != nil {
				return nil, err
			}
		}
		cfg.Secrets.Kube = protectedSecrets{Reader: cfg.Secrets.Kube, pc: pc, protect: c.protect}
	}
	d, err := b.Connect(ctx, cfg)
	if err != nil {
		return unconnected(ctx, cr, errors.Wrapf(err, "cannot connect to the %s backend of %s", b.Name, cfg.Name))
	}
	secrets := c.secrets
	secrets.Namespace = cr.GetNamespace()
	e := &external[P]{kube: c.kube, kind: c.kind, cfg: cfg, driver: c.stalls.wrap(stallKey(cfg, cr.GetNamespace()), telemetry.Instrument(b.Name, d)), secrets: secrets, passwords: c.passwords, record: c.record, hints: c.hints, egress: c.egress}
	if meta.WasDeleted(mg) {
		return deletingClient[P]{e}, nil
	}
	return e, nil
}

// unconnected is Connect's answer when it cannot build the driver of cr
// (err: its config does not exist or cannot be read, holds another
// backend's block, or its backend cannot be reached with it). A resource
// being deleted that never made an instance (madeInstance) has nothing to
// delete: it gets a client that finds no instance, so the runtime lets it
// go by its usual path (the finalizer, and childrenFinalizer), instead of
// holding it, and its namespace, for ever on a config that never worked
// (a typo in spec.providerConfigRef, a credentials Secret that never
// existed). Any other gets err, with deletingHint. So does one whose
// err may pass (transientConnect) for connectGrace after its deletion: a
// create whose annotations a crash lost leaves no sign, and its instance
// is deleted once the backend answers; a backend that stays away does not
// hold the namespace for ever.
func unconnected[P any](ctx context.Context, cr Resource[P], err error) (managed.ExternalClient, error) {
	if !meta.WasDeleted(cr) || madeInstance(cr) {
		return nil, deletingHint(cr, err)
	}
	if since := time.Since(cr.GetDeletionTimestamp().Time); transientConnect(err) && since < connectGrace {
		return nil, deletingHint(cr, errors.Wrapf(err, "retried for %s after the deletion (%s so far), then the resource, which shows no sign of an instance, is let go", connectGrace, since.Round(time.Second)))
	}
	// No event: a namespace being deleted refuses new ones.
	if log, lerr := logr.FromContext(ctx); lerr == nil {
		log.Info("letting go of a resource being deleted that never made an instance: its config cannot be used, and there is nothing to delete",
			"namespace", cr.GetNamespace(), "name", cr.GetName(), "reason", err.Error())
	}
	return noInstance{}, nil
}

// connectGrace is how long after its deletion a resource without a sign
// of an instance waits for a Connect error that may pass.
const connectGrace = 10 * time.Minute

// transientConnect reports whether a Connect error may pass by itself: an
// API server or backend that is busy, times out or cannot be reached.
// A config or Secret that is gone, invalid or refused does not.
func transientConnect(err error) bool {
	var dns *net.DNSError
	var ne net.Error
	var pe *proxy.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return true
	case kerrors.IsServerTimeout(err), kerrors.IsTimeout(err), kerrors.IsTooManyRequests(err), kerrors.IsInternalError(err),
		kerrors.IsServiceUnavailable(err), kerrors.IsUnexpectedServerError(err):
		return true
	case errors.As(err, &dns):
		return !dns.IsNotFound
	case errors.As(err, &ne):
		return true
	case errors.As(err, &pe):
		return pe.Class == proxy.ClassTransient || pe.Class == proxy.ClassQuota
	}
	return false
}

// madeInstance reports whether cr carries any sign that it made, or
// observed, an instance: the annotations crossplane-runtime writes around
// Create (-pending rarely reaches the API server alone, see package
// writes; -succeeded or -failed follow every Create), or what an Observe
// or a Create recorded (an ID, an operation in flight, a placement, a
// state, an address, a Ready condition). A resource whose management
// policies never let it create counts only the annotations: what it
// observed was imported, and a Delete would leave that alone (foreign).
// Ready Deleting is no sign: observeDeleting sets it before it looks (and
// records the ID of an instance it finds).
func madeInstance[P any](cr Resource[P]) bool {
	if !meta.GetExternalCreatePending(cr).IsZero() || !meta.GetExternalCreateSucceeded(cr).IsZero() || !meta.GetExternalCreateFailed(cr).IsZero() {
		return true
	}
	if !creates(cr.GetManagementPolicies()) {
		return false
	}
	o := cr.Observation()
	ready := cr.GetCondition(xpv2.TypeReady).Reason
	return o.ID != "" || o.Operation != "" || o.Placement != nil || o.State != "" || o.IP != "" || o.CreatedAt != nil ||
		(ready != "" && ready != xpv2.ReasonDeleting)
}

// neverMade reports whether cr, being deleted with Ref r, can hold no
// instance: r carries no ID and cr no sign of one (madeInstance). A crash
// between the driver's Create and the annotations after it leaves no sign
// (the writes client drops -pending), but that create resolved the spec,
// so only a config changed since leaves the driver nowhere to look.
func neverMade[P any](cr Resource[P], r proxy.Ref) bool {
	return r.ID == "" && !madeInstance(cr)
}

// noInstance is the external client of a resource being deleted that
// never made an instance (unconnected): it finds none and does nothing.
type noInstance struct{}

func (noInstance) Observe(context.Context, resource.Managed) (managed.ExternalObservation, error) {
	return managed.ExternalObservation{ResourceExists: false}, nil
}

func (noInstance) Create(context.Context, resource.Managed) (managed.ExternalCreation, error) {
	return managed.ExternalCreation{}, nil
}

func (noInstance) Update(context.Context, resource.Managed) (managed.ExternalUpdate, error) {
	return managed.ExternalUpdate{}, nil
}

func (noInstance) Delete(context.Context, resource.Managed) (managed.ExternalDelete, error) {
	return managed.ExternalDelete{}, nil
}

func (noInstance) Disconnect(context.Context) error { return nil }

// deletingClient is the external client of a resource being deleted: its
// Observe's and Delete's errors say, as deletingHint does for Connect's,
// that the resource (and so its namespace) stays until the instance is
// deleted, and the ways out.
type deletingClient[P any] struct{ *external[P] }

func (c deletingClient[P]) Observe(ctx context.Context, mg resource.Managed) (managed.ExternalObservation, error) {
	obs, err := c.external.Observe(ctx, mg)
	return obs, backendHint(mg, err)
}

func (c deletingClient[P]) Delete(ctx context.Context, mg resource.Managed) (managed.ExternalDelete, error) {
	d, err := c.external.Delete(ctx, mg)
	return d, backendHint(mg, err)
}

// protectedSecrets reads a namespaced config's Secrets for the Connect of
// a resource that is not being deleted, and returns none that lacks the
// config's SecretFinalizer: a Secret the config names since it was
// protected, or one created after that, has none yet, and a namespace
// deleted next could take it before the resource's Delete reads it. A
// Secret that has it (the common case) costs no request more.
type protectedSecrets struct {
	client.Reader
	pc      *namespacedv1alpha1.ProviderConfig
	protect func(context.Context, *namespacedv1alpha1.ProviderConfig) error
}

func (r protectedSecrets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := r.Reader.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	f := config.SecretFinalizer(r.pc.Name)
	// A Secret the config does not name is one the Protector would release.
	if meta.FinalizerExists(obj, f) || !slices.Contains(config.SecretNames(&r.pc.Spec.ProviderConfigSpec), key.Name) {
		return nil
	}
	if err := r.protect(ctx, r.pc); err != nil {
		return err
	}
	if err := r.Reader.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	switch {
	case meta.FinalizerExists(obj, f):
		return nil
	case meta.WasDeleted(obj):
		return errors.Errorf("it is being deleted, so ProviderConfig %s/%s cannot protect it for the Delete of the resources that name the config", r.pc.Namespace, r.pc.Name)
	default:
		return errors.Errorf("ProviderConfig %s/%s could not protect it for the Delete of the resources that name the config (it lacks the finalizer %s)", r.pc.Namespace, r.pc.Name, f)
	}
}

// track records mg's use of its config. A resource being deleted in a
// namespace that is being deleted goes on without: the namespace refuses
// new objects, and the usage (deleted with the namespace's other objects)
// only protects configs, which the resource no longer needs protected
// from anything but the namespace's deletion (config.Protector does that).
func (c *connector[P]) track(ctx context.Context, mg resource.Managed) error {
	var err error
	switch m := mg.(type) {
	case resource.ModernManaged:
		err = c.modern.Track(ctx, m)
	case resource.LegacyManaged:
		err = c.legacy.Track(ctx, m)
	}
	if err != nil && !(meta.WasDeleted(mg) && kerrors.HasStatusCause(err, corev1.NamespaceTerminatingCause)) {
		return errors.Wrap(err, "cannot track ProviderConfig usage")
	}
	return nil
}

// deletingHint adds to a Connect error of a resource being deleted what
// it means: the instance cannot be deleted, the resource stays (retried
// with backoff), and the ways out.
func deletingHint(mg resource.Managed, err error) error {
	return stuckHint(mg, err, "restore its config and the Secrets the config reads")
}

// backendHint is deletingHint for an error of the backend (observing or
// deleting the instance of a resource being deleted). A Permanent one
// does not go away by waiting: it says so.
func backendHint(mg resource.Managed, err error) error {
	if proxy.IsPermanent(err) {
		return stuckHint(mg, err, "this cannot succeed until what the error names changes, in the config or on the backend (it is retried with backoff meanwhile)")
	}
	return stuckHint(mg, err, "it is retried with backoff until the backend answers (restore the backend, or its place in the config, if either is gone)")
}

// stuckHint wraps err, of a resource being deleted, with what it means
// (the instance, and with it the resource, stays), what to do (fix), and
// the way out that leaves the instance: management policies without
// Delete, whose deletion lets the instance go without the config or the
// backend (a finalizer removed by hand records no release, and a
// PodProxy's Deployment would go with its owner).
func stuckHint(mg resource.Managed, err error, fix string) error {
	if err == nil || !meta.WasDeleted(mg) {
		return err
	}
	return errors.Wrapf(err, `cannot delete the instance of %s, which stays until it can: %s (or, to leave the instance on the backend, set this resource's spec.managementPolicies to ["Observe", "Create", "Update", "LateInitialize"]: its deletion then lets the instance go without deleting it, to the config's orphan sweep where a ClusterProviderConfig does not allowTenantRelease)`, mg.GetName(), fix)
}

type external[P any] struct {
	kube      client.Client
	kind      Kind[P]
	cfg       *Config
	driver    proxy.Driver
	secrets   Secrets
	passwords *Passwords
	record    event.Recorder
	hints     *retryHints
	egress    *squid.EgressChecker
	// deleteMark, set by observeDeleting, is the mark of the instance this
	// reconcile found for the resource being deleted: its own UID's, under
	// this or another installation ID. Delete names it, so that the
	// driver's mark check passes for the instance found.
	deleteMark *proxy.Mark
}

// span starts the one span of an external-client operation.
func (e *external[P]) span(ctx context.Context, op string, mg resource.Managed) (context.Context, func(error)) {
	ctx, s := telemetry.Tracer().Start(ctx, "egressproxy."+op, trace.WithAttributes(
		attribute.String("egressproxy.kind", e.kind.Name),
		semconv.K8SNamespaceName(mg.GetNamespace()),
		attribute.String("egressproxy.resource", mg.GetName()),
		attribute.String("egressproxy.provider_config", e.cfg.Name),
	))
	return ctx, func(err error) {
		e.hints.note(mg, err)
		if err != nil {
			s.SetStatus(codes.Error, telemetry.ErrorClass(err))
			s.SetAttributes(semconv.ErrorTypeKey.String(telemetry.ErrorClass(err)))
		}
		s.End()
	}
}

func (e *external[P]) Observe(ctx context.Context, mg resource.Managed) (obs managed.ExternalObservation, err error) {
	ctx, end := e.span(ctx, "Observe", mg)
	defer func() { end(err) }()
	cr := mg.(Resource[P]) //nolint:forcetypeassert // Connect checked the type.
	if meta.WasDeleted(cr) {
		return e.observeDeleting(ctx, cr)
	}

	req, err := e.request(ctx, cr)
	if err != nil {
		return managed.ExternalObservation{}, err
	}
	status := cr.Observation()
	inst, err := e.driver.Get(ctx, ref(cr, req, status))
	if proxy.IsNotFound(err) {
		*status = spec.ProxyObservation{}
		e.forgetEgress(cr)
		return managed.ExternalObservation{ResourceExists: false}, nil
	}
	if err != nil {
		return managed.ExternalObservation{}, e.describe(err, "cannot observe the instance")
	}
	if foreign := e.foreign(cr, inst); foreign != nil {
		if inst.Mark == (proxy.Mark{}) {
			// Never the resource's own: what an import published of it
			// before it was refused (allowTenantImports turned off) goes.
			*status = spec.ProxyObservation{}
			e.forgetEgress(cr)
			cr.SetConditions(xpv2.Unavailable().WithObservedGeneration(cr.GetGeneration()))
		}
		return managed.ExternalObservation{}, foreign
	}
	before := egressOf(status)
	standingReport(&inst, req, false)
	setObservation(status, inst, req, e.kind.Location)
	e.setEgress(ctx, cr, &inst, req, before)
	e.setReadiness(cr, inst)
	e.setSecure(cr, inst, req)
	if e.kind.AnswerRecheck > 0 && answerSoon(inst, time.Now()) {
		e.hints.noteSoon(cr, e.kind.AnswerRecheck)
	}
	return managed.ExternalObservation{
		ResourceExists:    true,
		ResourceUpToDate:  inst.SpecHash == "" || inst.SpecHash == proxy.Hash(req),
		ConnectionDetails: e.unpublished(ctx, cr, connectionDetails(inst, withoutGeneratedPassword(req, inst, e.kind.Proxy(cr.Parameters())), e.cfg.Spec.NoProxy)),
	}, nil
}

// withoutGeneratedPassword is req without its password when inst is an
// import (no mark: made by hand) and the password is one the provider
// generated, which that instance never had: such a resource publishes
// credentials only from passwordSecretRef. The resource's own instance
// keeps the password it was made with, also under Observe.
func withoutGeneratedPassword(req proxy.Request, inst proxy.Instance, ps *spec.ProxySettings) proxy.Request {
	if inst.Mark != (proxy.Mark{}) || (ps.Auth != nil && ps.Auth.PasswordSecretRef != nil) {
		return req
	}
	req.Proxy.Auth.Password = ""
	return req
}

// answerWindow is how long after its creation an instance with an address
// whose proxy does not answer yet is looked at every Kind.AnswerRecheck:
// a guest's Squid starts at the end of its boot, and the not-Ready poll
// (10 s by default) would add up to that much to its create-to-Ready.
// Later (a proxy that stopped answering) the poll holds.
const answerWindow = 10 * time.Minute

// answerSoon reports whether inst is a new instance, at now, with an
// address whose proxy does not answer yet.
func answerSoon(inst proxy.Instance, now time.Time) bool {
	return inst.State == proxy.StateRunning && inst.IP != "" && !inst.ProxyReachable &&
		!inst.CreatedAt.IsZero() && now.Sub(inst.CreatedAt) < answerWindow
}

// unpublished is d, or nil when mg's connection Secret (in the watch of
// connection Secrets) already holds exactly d. crossplane-runtime's
// publisher compares the Secret's data with the details by go-cmp on every
// reconcile, a large share of a steady reconcile's CPU; it cannot be
// replaced (v2.4.0 keeps that option unexported). Nil details cost it
// nothing, and the writes client leaves
// out a connection Secret patch with no data, so nothing is sent either
// way. Only with that client and its watch: without the client the data
// would be patched empty, without the watch the read is a request.
func (e *external[P]) unpublished(ctx context.Context, mg resource.Managed, d managed.ConnectionDetails) managed.ConnectionDetails {
	if wc, ok := e.kube.(*writes.Client); !ok || !wc.CachesConnectionSecrets() || len(d) == 0 {
		return d
	}
	var key types.NamespacedName
	switch o := mg.(type) {
	case resource.LocalConnectionSecretOwner:
		r := o.GetWriteConnectionSecretToReference()
		if r == nil {
			return d
		}
		key = types.NamespacedName{Namespace: mg.GetNamespace(), Name: r.Name}
	case resource.ConnectionSecretOwner:
		r := o.GetWriteConnectionSecretToReference()
		if r == nil {
			return d
		}
		key = types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
	default:
		return d
	}
	s := &corev1.Secret{}
	if err := e.kube.Get(ctx, key, s); err != nil || s.Type != resource.SecretTypeConnection || !controlledBy(s, mg.GetUID()) || !writes.HeldData(s, d) {
		return d
	}
	return nil
}

func controlledBy(o metav1.Object, uid types.UID) bool {
	c := metav1.GetControllerOf(o)
	return c != nil && c.UID == uid
}

func (e *external[P]) Create(ctx context.Context, mg resource.Managed) (c managed.ExternalCreation, err error) {
	ctx, end := e.span(ctx, "Create", mg)
	defer func() { end(err) }()
	cr := mg.(Resource[P]) //nolint:forcetypeassert // Connect checked the type.

	inst, details, err := e.write(ctx, cr, "cannot create the instance", func(req proxy.Request) (proxy.Instance, error) {
		return e.driver.Create(ctx, req)
	})
	if err != nil {
		return managed.ExternalCreation{}, err
	}
	if inst.Operation != "" {
		if err := e.saveObservation(ctx, cr); err != nil {
			return managed.ExternalCreation{}, err
		}
	}
	return managed.ExternalCreation{ConnectionDetails: details}, nil
}

// write is what Create and Update share: the request built from cr's
// spec, the driver's write of it (call; an error described as what), and
// the instance it returns observed onto cr. It returns the instance and
// its connection details.
func (e *external[P]) write(ctx context.Context, cr Resource[P], what string, call func(proxy.Request) (proxy.Instance, error)) (proxy.Instance, managed.ConnectionDetails, error) {
	req, err := e.request(ctx, cr)
	if err != nil {
		return proxy.Instance{}, nil, err
	}
	inst, err := call(req)
	if err != nil {
		return proxy.Instance{}, nil, e.describe(err, what)
	}
	before := egressOf(cr.Observation())
	standingReport(&inst, req, true)
	setObservation(cr.Observation(), inst, req, e.kind.Location)
	e.setEgress(ctx, cr, &inst, req, before)
	e.setReadiness(cr, inst)
	e.setSecure(cr, inst, req)
	return inst, connectionDetails(inst, req, e.cfg.Spec.NoProxy), nil
}

// saveObservation writes status.atProvider at once, for an instance with
// an operation in flight: its outcome (an asynchronous failure) is read
// through the operation and must not be lost. The status write that
// follows Create saves the rest with it (keepingCreated keeps what Create
// recorded through this patch and the annotation update, whose responses
// carry the server's status); if that write fails, the next Observe finds
// the instance by its name. A merge patch of the status subresource needs
// no resourceVersion and cannot conflict.
func (e *external[P]) saveObservation(ctx context.Context, cr Resource[P]) error {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"atProvider": cr.Observation()}})
	if err != nil {
		return err
	}
	obj, ok := any(cr).(client.Object)
	if !ok {
		return nil
	}
	return keepingCreated(obj, func() error {
		return errors.Wrap(e.kube.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)), "cannot save status.atProvider")
	})
}

func (e *external[P]) Update(ctx context.Context, mg resource.Managed) (u managed.ExternalUpdate, err error) {
	ctx, end := e.span(ctx, "Update", mg)
	defer func() { end(err) }()
	cr := mg.(Resource[P]) //nolint:forcetypeassert // Connect checked the type.

	_, details, err := e.write(ctx, cr, "cannot update the instance", func(req proxy.Request) (proxy.Instance, error) {
		return e.driver.Update(ctx, ref(cr, req, cr.Observation()), req)
	})
	if err != nil {
		return managed.ExternalUpdate{}, err
	}
	return managed.ExternalUpdate{ConnectionDetails: details}, nil
}

func (e *external[P]) Delete(ctx context.Context, mg resource.Managed) (d managed.ExternalDelete, err error) {
	ctx, end := e.span(ctx, "Delete", mg)
	defer func() { end(err) }()
	cr := mg.(Resource[P]) //nolint:forcetypeassert // Connect checked the type.

	r := e.deletionRef(cr)
	if e.deleteMark != nil {
		r.Mark = *e.deleteMark
	}
	if err := e.driver.Delete(ctx, r); err != nil {
		return managed.ExternalDelete{}, e.describe(err, "cannot delete the instance")
	}
	return managed.ExternalDelete{}, nil
}

func (e *external[P]) Disconnect(context.Context) error { return nil }

// deletionRef is the least a resource being deleted needs to find its
// instance: the external name, the mark and the ID it recorded, plus the
// placement. It reads no Secret (the password Secret may be gone first, as
// in a namespace teardown) and does not fail on a catalogue key, host,
// node or zone the config lacks (a typo, or one removed since): then the
// placement is what the kind resolved before failing (kinds resolve the
// location first), the rest as recorded, so that a driver can still look
// for the instance by name where it stands; drivers prefer the ID.
func (e *external[P]) deletionRef(cr Resource[P]) proxy.Ref {
	req := proxy.Request{Name: meta.GetExternalName(cr), Mark: proxy.Mark{UID: string(cr.GetUID()), InstallationID: e.cfg.InstallationID}}
	recorded := Recorded(cr.Observation(), e.kind.Location)
	req.Placement = recorded
	req.TenantGuest = e.cfg.TenantMayWriteGuest()
	if err := e.kind.Request(e.cfg, cr.Parameters(), &req); err != nil {
		req.Placement = orRecorded(req.Placement, recorded)
	} else {
		req.TenantGuest = e.cfg.TenantGuest(req)
	}
	return ref(cr, req, cr.Observation())
}

// orRecorded is p with each field Request left empty (it failed on it, or
// before it) taken from recorded.
func orRecorded(p, recorded proxy.Placement) proxy.Placement {
	for _, f := range []struct{ got, rec *string }{{&p.Location, &recorded.Location}, {&p.MachineType, &recorded.MachineType}, {&p.Image, &recorded.Image}} {
		if *f.got == "" {
			*f.got = *f.rec
		}
	}
	return p
}

// observeDeleting observes a resource being deleted with deletionRef. An
// instance that is gone, or is not this resource's, lets the resource go;
// pieces a Create cut short left without an instance are reported by the
// driver as an instance (Ref.Deleting), so Delete removes them first.
// One the driver cannot read for good (a Permanent error, such as a host
// removed from the config) is handed to the driver's Delete at once, which
// knows whether it can let go of it: otherwise the runtime, which only
// deletes what Observe found, would retry the read forever. When that
// Delete cannot even look (Unresolved: no ID, and a spec naming a zone or
// host the config lacks), a resource that never made an instance
// (neverMade) is let go, as unconnected lets go of one whose config
// cannot be used: a typo would otherwise hold its namespace for ever.
//
// An instance carrying this resource's UID under another installation ID
// (the config's installationID was set or changed, or the provider's, since
// it was made) is this resource's own: it is deleted, under its own mark
// (deleteMark; a driver that deletes in steps reports what is left under
// the mark it carries), not left behind. Another resource's UID, or no mark, is never ours.
//
// Ready reads Deleting from the first look on, as the runtime sets it only
// once a Delete was requested: a resource whose instance cannot be read
// does not read Available while it holds its namespace.
func (e *external[P]) observeDeleting(ctx context.Context, cr Resource[P]) (managed.ExternalObservation, error) {
	e.forgetEgress(cr)
	cr.SetConditions(xpv2.Deleting().WithObservedGeneration(cr.GetGeneration()))
	r := e.deletionRef(cr)
	inst, err := e.driver.Get(ctx, r)
	switch {
	case proxy.IsNotFound(err):
		return managed.ExternalObservation{ResourceExists: false}, nil
	case proxy.IsPermanent(err):
		derr := e.driver.Delete(ctx, r)
		switch {
		case derr == nil:
		case proxy.IsUnresolved(derr) && neverMade(cr, r):
			if log, lerr := logr.FromContext(ctx); lerr == nil {
				log.Info("letting go of a resource being deleted that never made an instance: its spec names no place to look for one",
					"namespace", cr.GetNamespace(), "name", cr.GetName(), "reason", derr.Error())
			}
		default:
			return managed.ExternalObservation{}, e.describe(derr, fmt.Sprintf("cannot delete the instance (it cannot be read either: %v)", err))
		}
		return managed.ExternalObservation{ResourceExists: false}, nil
	case err != nil:
		return managed.ExternalObservation{}, e.describe(err, "cannot observe the instance being deleted")
	}
	own := proxy.Mark{UID: string(cr.GetUID()), InstallationID: e.cfg.InstallationID}
	switch {
	case own.UID != "" && inst.Mark.UID == own.UID && inst.Mark != own:
		// This resource's own instance, made under another installation.
		m := inst.Mark
		e.deleteMark = &m
		if log, lerr := logr.FromContext(ctx); lerr == nil {
			log.V(1).Info("deleting the resource's own instance, made under another installation ID", "instance", inst.Name, "installation", m.InstallationID, "now", own.InstallationID)
		}
	case e.foreign(cr, inst) != nil:
		// Never ours: deleting the resource leaves the instance alone.
		return managed.ExternalObservation{ResourceExists: false}, nil
	case inst.Mark.UID == own.UID:
		m := inst.Mark
		e.deleteMark = &m
	}
	if o := cr.Observation(); o.ID == "" && inst.ID != "" {
		// Found by name: from now on by its ID, and a sign (madeInstance)
		// that keeps the resource should its zone or host leave the config.
		o.ID = inst.ID
	}
	// ResourceUpToDate: nothing is updated on the way out.
	return managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, nil
}

// request builds the driver request: name, mark, resolved proxy settings
// (with the password), then the kind's placement and options.
func (e *external[P]) request(ctx context.Context, cr Resource[P]) (proxy.Request, error) {
	req := proxy.Request{
		Name: meta.GetExternalName(cr),
		Mark: proxy.Mark{UID: string(cr.GetUID()), InstallationID: e.cfg.InstallationID},
	}
	settings, err := e.settings(ctx, cr, e.kind.Proxy(cr.Parameters()))
	if err != nil {
		return proxy.Request{}, err
	}
	req.Proxy = settings
	// The kind resolves an empty key to what the instance was made with.
	req.Placement = Recorded(cr.Observation(), e.kind.Location)
	if err := e.kind.Request(e.cfg, cr.Parameters(), &req); err != nil {
		return proxy.Request{}, err
	}
	if e.kind.Owned != nil {
		e.kind.Owned(e.cfg, cr, &req)
	}
	// What the config allows its proxies, checked here rather than in
	// kind.Request so that a proxy the config no longer allows can still be
	// deleted.
	if err := e.cfg.Allows(req); err != nil {
		return proxy.Request{}, err
	}
	req.TenantGuest = e.cfg.TenantGuest(req)
	secrets := []string{req.Proxy.Auth.Password, req.CloudInit}
	if c := req.Proxy.EgressCheck; c != nil {
		// Only then: every other instance's digest stays as it was.
		secrets = append(secrets, c.Password)
	}
	if t := req.Proxy.TLS; t != nil {
		// Only then, as the check's.
		secrets = append(secrets, "tls", t.Key)
	}
	if req.SecretDigest, err = e.passwords.Digest(ctx, secrets...); err != nil {
		return proxy.Request{}, err
	}
	return req, nil
}

func (e *external[P]) settings(ctx context.Context, cr Resource[P], ps *spec.ProxySettings) (proxy.Settings, error) {
	s := proxy.Settings{
		Port:                defaultPort,
		AllowedClientCIDRs:  ps.AllowedClientCIDRs,
		AllowedPorts:        ps.AllowedPorts,
		AllowedDestinations: ps.AllowedDestinations,

		AllowedDestinationCIDRs: ps.AllowedDestinationCIDRs,
	}
	if ps.Port != nil {
		s.Port = *ps.Port
	}
	check, err := e.egressCheck(ctx, string(cr.GetUID()))
	if err != nil {
		return proxy.Settings{}, err
	}
	if ps.TLS != nil {
		if s.TLS, err = e.proxyTLS(ctx, ps.TLS.SecretRef); err != nil {
			return proxy.Settings{}, err
		}
		if check != nil {
			check.ProxyCA = s.TLS.CA
		}
	}
	s.EgressCheck = check
	if len(s.AllowedPorts) == 0 {
		s.AllowedPorts = []int32{443}
	}
	if ps.Auth == nil || !ps.Auth.Enabled {
		return s, nil
	}
	s.Auth = proxy.Auth{Enabled: true, Username: ps.Auth.Username}
	if s.Auth.Username == "" {
		s.Auth.Username = defaultUsername
	}
	if ps.Auth.PasswordSecretRef != nil {
		pw, err := e.secrets.Get(ctx, "spec.forProvider.proxy.auth.passwordSecretRef", ps.Auth.PasswordSecretRef)
		if err != nil {
			return proxy.Settings{}, err
		}
		s.Auth.Password = string(pw)
		return s, nil
	}
	pw, err := e.passwords.For(ctx, string(cr.GetUID()))
	if err != nil {
		return proxy.Settings{}, errors.Wrap(err, "cannot generate the proxy password")
	}
	s.Auth.Password = pw
	return s, nil
}

// foreign returns an error when inst is not this resource's: it carries no
// mark or another resource's. An Observe-only resource may import an
// unmarked instance (made by hand), never one the provider made for
// another resource: that one is read only through its own resource, so an
// external name cannot be used to read another team's proxy. A tenant on
// the platform's config imports only where the config allows it: the
// platform's hand-made instances are not the tenant's to read.
func (e *external[P]) foreign(cr Resource[P], inst proxy.Instance) error {
	own := proxy.Mark{UID: string(cr.GetUID()), InstallationID: e.cfg.InstallationID}
	importing := observeOnly(cr.GetManagementPolicies())
	tenantImport := !e.cfg.Tenant || e.cfg.Spec.AllowTenantImports
	switch {
	case inst.Mark == own:
		return nil
	case inst.Mark == (proxy.Mark{}) && importing && tenantImport:
		return nil
	case inst.Mark == (proxy.Mark{}) && importing:
		return errors.Errorf("instance %s was not created by provider-egressproxy (it carries no ownership mark), and %s does not let namespaced resources import such instances (its allowTenantImports is false, the default); refusing to import it: use a ProviderConfig of this namespace, or ask the platform team to set allowTenantImports: true", inst.Name, e.cfg.Name)
	case inst.Mark == (proxy.Mark{}) && !tenantImport:
		return errors.Errorf("instance %s exists but was not created by provider-egressproxy (it carries no ownership mark); refusing to adopt it: choose another external name", inst.Name)
	case inst.Mark == (proxy.Mark{}):
		return errors.Errorf("instance %s exists but was not created by provider-egressproxy (it carries no ownership mark); refusing to adopt it: remove or rename it on the backend, or import it with spec.managementPolicies: [\"Observe\"]", inst.Name)
	case inst.Mark.UID == own.UID:
		// This resource's own instance, made under another installation
		// ID: the config's installationID was set or changed since.
		fix := fmt.Sprintf("give the config back installationID %q", inst.Mark.InstallationID)
		if e.cfg.Spec.InstallationID == "" {
			// The provider's own ID (--installation-id, or its ConfigMap).
			fix = fmt.Sprintf("run the provider with --installation-id=%s (or restore its ConfigMap), or set the config's installationID to it", inst.Mark.InstallationID)
		}
		return errors.Errorf("instance %s was made by this resource under installation %q, but %s now gives installation %q; refusing to manage it under another installation's mark: %s (an installation ID does not move instances made before it)", inst.Name, inst.Mark.InstallationID, e.cfg.Name, own.InstallationID, fix)
	case importing:
		return errors.Errorf("instance %s belongs to another resource (UID %s, installation %q); refusing to import it: an instance the provider created is observed only through the resource it was created for", inst.Name, inst.Mark.UID, inst.Mark.InstallationID)
	default:
		return errors.Errorf("instance %s exists but belongs to another resource (UID %s, installation %q); refusing to adopt it: choose another external name, or remove the other resource", inst.Name, inst.Mark.UID, inst.Mark.InstallationID)
	}
}

func observeOnly(p xpv2.ManagementPolicies) bool {
	for _, a := range p {
		if a != xpv2.ManagementActionObserve {
			return false
		}
	}
	return len(p) > 0
}

// ref is the Ref of mg's instance. A miss ends a resource being deleted
// and is final for an import (the instance is not the driver's own): then
// the driver is asked to read the backend itself (Live).
func ref(mg resource.Managed, req proxy.Request, status *spec.ProxyObservation) proxy.Ref {
	return proxy.Ref{ID: status.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement, Operation: status.Operation,
		Live: !creates(mg.GetManagementPolicies()) || meta.WasDeleted(mg), Deleting: meta.WasDeleted(mg), ProxyCA: req.Proxy.ProxyCA(),
		TenantGuest: req.TenantGuest}
}

// creates reports whether management policies p let the resource create
// its instance (no policies means the default, everything).
func creates(p xpv2.ManagementPolicies) bool {
	for _, a := range p {
		if a == xpv2.ManagementActionAll || a == xpv2.ManagementActionCreate {
			return true
		}
	}
	return len(p) == 0
}

func setObservation(o *spec.ProxyObservation, inst proxy.Instance, req proxy.Request, location func(*spec.Placement) *string) {
	*o = spec.ProxyObservation{
		ID:             inst.ID,
		State:          string(inst.State),
		IP:             inst.IP,
		EgressIP:       inst.EgressIP,
		EgressIPs:      inst.EgressIPs,
		ProxyReachable: inst.ProxyReachable,
		Progress:       inst.Progress,
		Operation:      inst.Operation,
		Details:        inst.Details,
	}
	if !inst.CreatedAt.IsZero() {
		t := metav1.NewTime(inst.CreatedAt)
		o.CreatedAt = &t
	}
	if inst.IP != "" {
		host := inst.Host
		if host == "" {
			host = inst.IP
		}
		o.Endpoint = net.JoinHostPort(host, strconv.Itoa(int(req.Proxy.Port)))
	}
	p := inst.Placement
	if p == (proxy.Placement{}) {
		p = req.Placement
	}
	if p != (proxy.Placement{}) {
		o.Placement = &spec.Placement{MachineType: p.MachineType, Image: p.Image}
		if location != nil {
			*location(o.Placement) = p.Location
		}
	}
}

// setReadiness sets the Ready condition and records an event when it
// changes status or reason, except on the way into Creating from nothing
// (crossplane-runtime records the create).
func (e *external[P]) setReadiness(cr resource.Managed, inst proxy.Instance) {
	was := cr.GetCondition(xpv2.TypeReady)
	setReadiness(cr, inst)
	is := cr.GetCondition(xpv2.TypeReady)
	if e.record == nil || (was.Status == is.Status && was.Reason == is.Reason) || (was.Reason == "" && is.Reason == xpv2.ReasonCreating) {
		return
	}
	ev := event.Event{Type: event.TypeWarning, Reason: event.Reason(is.Reason), Message: fmt.Sprintf("Ready is now %s (was %s)", is.Status, was.Status)}
	switch {
	case is.Status == corev1.ConditionTrue:
		ev.Type = event.TypeNormal
		ev.Message += fmt.Sprintf(": instance %s is running at %s and the proxy answers", inst.Name, inst.IP)
	case is.Message != "":
		ev.Message += ": " + is.Message
	}
	e.record.Event(cr, ev)
}

// setReadiness sets the Ready condition, with the generation it observed.
// An instance that is provisioning with nothing to report reads plain
// Creating, as crossplane-runtime marks a resource right after Create: the
// first Observe after Create then changes no condition and writes nothing.
func setReadiness(cr resource.Managed, inst proxy.Instance) {
	var c xpv2.Condition
	switch {
	case inst.State == proxy.StateRunning && inst.IP != "" && inst.ProxyReachable && inst.Mark == (proxy.Mark{}):
		c = xpv2.Available().WithMessage(imported(inst))
	case inst.State == proxy.StateRunning && inst.IP != "" && inst.ProxyReachable:
		c = xpv2.Available()
	case inst.State == proxy.StateRunning && inst.IP != "":
		c = xpv2.Creating().WithMessage(withProgress(fmt.Sprintf("instance %s is running at %s; waiting for the proxy to answer", inst.Name, inst.IP), inst.Progress))
	case (inst.State == proxy.StateProvisioning || inst.State == proxy.StateRunning || inst.State == "") && inst.Progress == "":
		c = xpv2.Creating()
	case inst.State == proxy.StateProvisioning || inst.State == proxy.StateRunning || inst.State == "":
		c = xpv2.Creating().WithMessage(withProgress(fmt.Sprintf("instance %s is provisioning", inst.Name), inst.Progress))
	default:
		c = xpv2.Unavailable().WithMessage(withProgress(fmt.Sprintf("instance %s is %s", inst.Name, inst.State), inst.Progress))
	}
	cr.SetConditions(c.WithObservedGeneration(cr.GetGeneration()))
}

// imported is the Ready message of an unmarked instance that serves: one
// an Observe-only resource imported (foreign refuses it to any other),
// whose Squid was checked as any Squid (squid.AnySquid), not as this
// resource's, with what it answered as when the driver reports it.
func imported(inst proxy.Instance) string {
	msg := fmt.Sprintf("instance %s is not the provider's (it carries no ownership mark; imported Observe-only, so any Squid answering counts)", inst.Name)
	if a := inst.Details[squid.DetailAnswer]; a != "" {
		msg += ": its Squid " + a
	}
	return msg
}

func withProgress(msg, progress string) string {
	if progress == "" {
		return msg
	}
	return msg + ": " + progress
}

// connectionDetails are published once the address is known: every key of
// spec.ConnectionKeys that applies. noProxy is the config's spec.noProxy.
// With auth on, username and password (and the URLs' credentials) are
// published only with a password: for an import, passwordSecretRef's
// alone.
func connectionDetails(inst proxy.Instance, req proxy.Request, noProxy []string) managed.ConnectionDetails {
	if inst.IP == "" && inst.EgressIP == "" {
		// The other details stay as last published, but an egress
		// address no longer known leaves: keys without a value are
		// removed (the writes client), and make no Secret.
		return managed.ConnectionDetails{spec.ConnectionEgressIP: nil, spec.ConnectionEgressIPs: nil}
	}
	if inst.IP == "" {
		return nil
	}
	host := inst.Host
	if host == "" {
		host = inst.IP
	}
	port := strconv.Itoa(int(req.Proxy.Port))
	u := url.URL{Scheme: "http", Host: net.JoinHostPort(host, port)}
	d := managed.ConnectionDetails{
		spec.ConnectionHost:     []byte(host),
		spec.ConnectionPort:     []byte(port),
		spec.ConnectionEndpoint: []byte(u.Host),
	}
	if t := req.Proxy.TLS; t != nil {
		u.Scheme = "https"
		d[spec.ConnectionCA] = []byte(t.CA)
	}
	// Credentials only with a password: an import without
	// passwordSecretRef has none (withoutGeneratedPassword), and
	// publishes no username either.
	if req.Proxy.Auth.Enabled && req.Proxy.Auth.Password != "" {
		u.User = url.UserPassword(req.Proxy.Auth.Username, req.Proxy.Auth.Password)
		d[spec.ConnectionUsername] = []byte(req.Proxy.Auth.Username)
		d[spec.ConnectionPassword] = []byte(req.Proxy.Auth.Password)
	}
	for _, k := range []string{spec.ConnectionURL, spec.ConnectionHTTPProxy, spec.ConnectionHTTPSProxy, spec.ConnectionHTTPProxyLower, spec.ConnectionHTTPSProxyLower} {
		d[k] = []byte(u.String())
	}
	np := []byte(NoProxy(noProxy))
	d[spec.ConnectionNoProxy], d[spec.ConnectionNoProxyLower] = np, np
	if inst.EgressIP != "" {
		d[spec.ConnectionEgressIP] = []byte(inst.EgressIP)
		ips := inst.EgressIPs
		if len(ips) == 0 {
			ips = []string{inst.EgressIP}
		}
		d[spec.ConnectionEgressIPs] = []byte(strings.Join(ips, ","))
	}
	return d
}

// NoProxy is the NO_PROXY value of a connection Secret: spec.DefaultNoProxy
// and then extra, each entry once, comma-separated.
func NoProxy(extra []string) string {
	seen := map[string]bool{}
	out := make([]string, 0, len(spec.DefaultNoProxy)+len(extra))
	for _, e := range append(slices.Clone(spec.DefaultNoProxy), extra...) {
		if e = strings.TrimSpace(e); e != "" && !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	return strings.Join(out, ",")
}

// describe wraps a driver error so the condition says what failed and how
// the provider treats it, and when it tries again if it waits.
func (e *external[P]) describe(err error, what string) error {
	return describe(err, what, e.hints.wait(err))
}

func describe(err error, what string, wait time.Duration) error {
	class := proxy.ClassOf(err)
	switch {
	case class == proxy.ClassPermanent:
		return errors.Wrapf(err, "%s (permanent: will not succeed until the resource, its config or the backend changes)", what)
	case class == proxy.ClassQuota && wait > 0:
		return errors.Wrapf(err, "%s (out of quota or capacity on the backend; will retry in %s)", what, wait)
	case class == proxy.ClassQuota:
		return errors.Wrapf(err, "%s (out of quota or capacity on the backend)", what)
	case wait > 0:
		return errors.Wrapf(err, "%s (%s, will retry in %s, as the backend asked)", what, class, wait)
	default:
		return errors.Wrapf(err, "%s (%s, will retry)", what, class)
	}
}

// tlsField is the field a TLS Secret's problems are reported under.
const tlsField = "spec.forProvider.proxy.tls.secretRef"

// proxyTLS reads and checks the proxy's TLS Secret (squid.LoadTLS), by
// the tenancy rules of every Secret a resource names. Its errors name the
// field, the Secret and its key, never the key material.
func (e *external[P]) proxyTLS(ctx context.Context, ref spec.SecretReference) (*proxy.TLS, error) {
	sec, err := e.secrets.Secret(ctx, tlsField, ref)
	if err != nil {
		return nil, err
	}
	t, err := squid.LoadTLS(sec.Data, time.Now())
	if err != nil {
		return nil, errors.Wrapf(err, "%s: Secret %s/%s", tlsField, sec.Namespace, sec.Name)
	}
	return t, nil
}
