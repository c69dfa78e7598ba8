// Package orphans sweeps each ProviderConfig's backend, periodically, for
// instances that carry this installation's mark but whose managed resource
// no longer exists: left behind when a finalizer was removed by hand, or
// when a resource was deleted while the provider could not reach its
// backend. By default they are reported (status.orphans, an event, the
// egressproxy_orphans metric); a config that sets orphans.policy Delete has
// those older than orphans.minAge deleted. Instances of another
// installation and unmarked ones are never listed, so never touched; nor
// are those their resource left on purpose (deletionPolicy Orphan,
// management policies without Delete), which the config records in
// status.released as the resource's finalizer goes: they are counted apart
// (status.orphans.released), and their entry goes once no instance carries
// the UID any more. A tenant's release on a ClusterProviderConfig (its
// entry names the namespace) counts only while the config sets
// allowTenantRelease; otherwise its instance is an orphan. So is, reported
// only, an instance whose resource exists but records another one.
package orphans

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	configctl "github.com/egressproxy/provider-egressproxy/internal/controller/config"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Event reasons.
const (
	ReasonOrphansFound  event.Reason = "OrphansFound"
	ReasonOrphanDeleted event.Reason = "OrphanDeleted"
	ReasonCannotSweep   event.Reason = "CannotSweepOrphans"
	ReasonCannotDelete  event.Reason = "CannotDeleteOrphan"
	ReasonHostDeparted  event.Reason = "HostLeftConfig"
	ReasonTidied        event.Reason = "UnusedImageDeleted"
	ReasonCannotTidy    event.Reason = "CannotDeleteUnusedImage"
	ReasonWithheld      event.Reason = "OrphanDeletionWithheld"
	maxListed                        = 20
	defaultMinAge                    = time.Hour
	defaultWorkers                   = 2
	defaultSweepTimeout              = 2 * time.Minute
	// youngest is the age below which an instance is never called an
	// orphan: the resource that made it may not be in the cache yet.
	youngest = 2 * time.Minute
	// settled is how long a release stays recorded, or unrecorded, before
	// the sweep may forget it for want of an instance: an instance whose
	// create was still under way when its resource went may not be listed
	// at once.
	settled = time.Hour
	// clockSkew is the margin by which an instance created after a release
	// went unrecorded (backend clock against the provider's) is still
	// taken for one created before it.
	clockSkew = 10 * time.Minute
)

// result is what one sweep found.
type result struct {
	// found are the orphans left (oldest first), deleted those deleted,
	// listed every instance of this installation.
	found, deleted, listed []proxy.Instance
	// released counts the instances (or pieces of one) listed that their
	// resource left on purpose.
	released int
	// withheld are the orphans Delete would have removed but for a release
	// that went unrecorded at unrecorded.
	withheld   []proxy.Instance
	unrecorded time.Time
	// record is the config as read for its status.released, and keep what
	// of status.released stays: nil when nothing changes.
	record config
	keep   *spec.ReleasedStatus
}

// config is the part of the three config kinds the sweeper needs.
type config interface {
	client.Object
}

// Sweeper sweeps one config kind's configs.
type Sweeper struct {
	// Kube reads configs and managed resources (the manager's cache) and
	// patches config status.
	Kube client.Client
	// Configs resolves configs, and their backends (ConfigReader.Backends)
	// build the drivers.
	Configs external.ConfigReader
	// Kinds are, by backend name, the managed resource kinds (both scopes)
	// whose UIDs an instance's mark may name.
	Kinds map[string][]schema.GroupVersionKind
	// Interval between two sweeps of one config.
	Interval time.Duration
	// Timeout of one sweep.
	Timeout time.Duration
	// Workers sweep this many configs at once (per config kind).
	Workers int
	Log     logging.Logger
	Events  event.Recorder

	kind      string
	newConfig func() config
	now       func() time.Time
	// stalls keeps one namespace's silent configs from holding every
	// sweep worker: while their sweeps stall they get a quarter of them.
	stalls *external.CheckGuard
}

// Setup registers a sweeper for each config kind in gvks. A zero Interval
// registers nothing.
func Setup(mgr ctrl.Manager, s Sweeper, gvks ...schema.GroupVersionKind) error {
	if s.Interval <= 0 {
		return nil
	}
	for _, gvk := range gvks {
		ss := s
		name := "orphans/" + strings.ToLower(gvk.GroupKind().String())
		ss.Log = s.Log.WithValues("controller", name)
		ss.kind = gvk.Kind
		ss.newConfig = configctl.NewFunc[config](mgr, gvk)
		if ss.Events == nil {
			ss.Events = event.NewAPIRecorder(mgr.GetEventRecorderFor(name))
		}
		workers := ss.Workers
		if workers <= 0 {
			workers = defaultWorkers
		}
		ss.stalls = external.NewCheckGuard(workers/4, clock.RealClock{})
		// A new config is swept at once, then every Interval.
		if err := configctl.SetupPeriodic(mgr, name, ss.newConfig(), workers, &ss); err != nil {
			return errors.Wrapf(err, "cannot set up the orphan sweep of %s", gvk.Kind)
		}
	}
	return nil
}

// Reconcile sweeps one config and requeues itself after the interval.
func (s *Sweeper) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pc := s.newConfig()
	label := s.configLabel(req.NamespacedName)
	if live, err := configctl.GetLive(ctx, s.Kube, req.NamespacedName, pc, func() { telemetry.ForgetOrphans(label) }); !live {
		return reconcile.Result{}, err
	}
	next := reconcile.Result{RequeueAfter: jitter(s.Interval)}
	cfg := s.Configs.Of(pc)
	if cfg == nil {
		return reconcile.Result{}, nil
	}
	backend := cfg.BackendName()
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = defaultSweepTimeout
	}
	end, err := s.stalls.Enter(cfg, pc.GetNamespace())
	if err != nil {
		// Swept once one of the namespace's stalled sweeps ends.
		s.Log.Debug("orphan sweep deferred", "config", cfg.Name, "error", err.Error())
		return reconcile.Result{RequeueAfter: jitter(timeout)}, nil
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := func() (result, error) {
		// Deferred: a sweep that panics still leaves the guard.
		defer end()
		return s.sweep(sctx, pc, cfg, backend)
	}()
	if err != nil {
		// Nothing is reported as an orphan when the sweep cannot tell.
		s.Log.Info("cannot sweep for orphans", "config", cfg.Name, "error", err.Error())
		s.Events.Event(pc, event.Warning(ReasonCannotSweep, err))
		return next, nil
	}
	found, deleted, listed := res.found, res.deleted, res.listed
	if res.keep != nil {
		// Another write since the read (a release recorded) fails with a
		// conflict: the next sweep tries again.
		if err := s.prune(ctx, res.record, res.keep); err != nil {
			s.Log.Debug("cannot prune status.released", "config", cfg.Name, "error", err.Error())
		}
	}
	telemetry.Orphans.WithLabelValues(backend, label).Set(float64(len(found)))
	prev := int32(-1)
	var before *spec.OrphanStatus
	if st, ok := statusOf(pc); ok && st.Orphans != nil {
		prev, before = st.Orphans.Count, st.Orphans
	}
	var hosts, departed, left []spec.OrphanHost
	if cfg.Backend != nil {
		if b, _ := cfg.Backend.Block(&cfg.Spec); b.Hosts != nil {
			hosts, departed, left = hostsOf(before, b.Hosts, listed, s.clock())
		}
	}
	if err := s.writeStatus(ctx, pc, found, res.released, hosts, departed); err != nil {
		return reconcile.Result{}, err
	}
	for _, h := range left {
		s.Events.Event(pc, event.Warning(ReasonHostDeparted, errors.Errorf(
			"host %s left the config with %d instance(s) of this installation on it when last listed: %s; the provider no longer reaches it, so they are neither observed nor deleted (see status.orphans.departedHosts; add the host back to let deletions and the sweep reach them)",
			h.Name, h.Count, strings.Join(h.Instances, ", "))))
	}
	if len(found) > 0 && int32(len(found)) != prev { //nolint:gosec // Far fewer than 2^31 instances.
		s.Events.Event(pc, event.Warning(ReasonOrphansFound, errors.Errorf(
			"%d instance(s) carry this installation's mark but their managed resource no longer exists, or records another instance: %s (see status.orphans; spec.orphans.policy Delete removes those whose resource is gone)",
			len(found), names(found))))
	}
	for _, d := range deleted {
		what := d.ID
		if len(d.Leftovers) > 0 {
			what = fmt.Sprintf("%s (no instance; %s)", d.ID, strings.Join(d.Leftovers, ", "))
		}
		s.Events.Event(pc, event.Normal(ReasonOrphanDeleted, fmt.Sprintf("deleted orphan %s (managed resource UID %s no longer exists)", what, d.Mark.UID)))
	}
	if len(res.withheld) > 0 {
		s.Events.Event(pc, event.Warning(ReasonWithheld, errors.Errorf(
			"%d orphan(s) not deleted: %s; a resource's release of its instance could not be recorded (status.released was full) at %s, and any of them may be the instance it left on purpose; delete those no one keeps by hand (the sweep clears status.released.unrecordedTime once none as old remains)",
			len(res.withheld), names(res.withheld), res.unrecorded.UTC().Format(time.RFC3339))))
	}
	return next, nil
}

// sweep lists the backend's instances with this installation's mark and
// returns those whose managed resource is gone (after deleting what the
// policy allows), oldest first. An instance its resource left on purpose
// (its UID in status.released) is no orphan.
func (s *Sweeper) sweep(ctx context.Context, pc config, cfg *external.Config, backend string) (res result, err error) {
	if cfg.Backend == nil {
		return res, errors.Errorf("%s holds no backend block this provider knows", cfg.Name)
	}
	// Before any credential is read, as the health check: a namespaced
	// config never sweeps with the provider's own identity or a setting
	// only a cluster-scoped config may make.
	if err := cfg.CheckTenancy(); err != nil {
		return res, err
	}
	uids, err := s.liveUIDs(ctx, backend, pc)
	if err != nil {
		return res, err
	}
	// Read after the resources: a resource records its release before its
	// finalizer goes, so one missing from the list above has its release
	// in this read unless the configs' watch runs behind the resources' by
	// more than that round trip.
	rec := s.newConfig()
	if err := s.Kube.Get(ctx, client.ObjectKeyFromObject(pc), rec); err != nil {
		return res, errors.Wrap(err, "cannot read the config's status.released")
	}
	res.record = rec
	var released *spec.ReleasedStatus
	if st, ok := statusOf(rec); ok && st.Released != nil {
		released = st.Released
	}
	// The switch from the same read as the record, which a release after
	// it was turned on may already be in.
	allowTenants := cfg.Spec.AllowTenantRelease
	if c, ok := rec.(*nsv1alpha1.ClusterProviderConfig); ok {
		allowTenants = c.Spec.AllowTenantRelease
	}
	releasedUIDs := map[string]bool{}
	// A tenant's release, recorded while the platform allowed it, counts
	// only while it still does; its entry is kept while its instance
	// stands, so that it counts again if the switch is turned back on.
	disallowed := map[string]bool{}
	if released != nil {
		for _, r := range released.Instances {
			if r.Namespace != "" && !allowTenants {
				disallowed[r.UID] = true
				continue
			}
			releasedUIDs[r.UID] = true
		}
		if t := released.UnrecordedTime; t != nil {
			res.unrecorded = t.Time
		}
	}
	d, err := cfg.Backend.Connect(ctx, cfg)
	if err != nil {
		return res, errors.Wrap(err, "cannot connect to the backend")
	}
	instances, err := d.List(ctx, cfg.InstallationID)
	if err != nil {
		return res, errors.Wrap(err, "cannot list the backend's instances")
	}
	res.listed = instances
	now := s.clock()
	policy, minAge := spec.OrphanPolicyReport, defaultMinAge
	if o := cfg.Spec.Orphans; o != nil {
		if o.Policy != "" {
			policy = o.Policy
		}
		if o.MinAge != nil {
			minAge = o.MinAge.Duration
		}
	}
	// mayBeUnrecorded tells whether inst may be the instance of a release
	// that went unrecorded: created (by its backend's clock) before it.
	mayBeUnrecorded := func(inst proxy.Instance) bool {
		return !res.unrecorded.IsZero() && (inst.CreatedAt.IsZero() || !inst.CreatedAt.After(res.unrecorded.Add(clockSkew)))
	}
	carried := map[string]bool{}
	unrecordedLeft := false
	for _, inst := range instances {
		if inst.Mark == (proxy.Mark{}) && len(inst.Leftovers) > 0 {
			// Pieces marked in part (a UID prefix): reported while no
			// resource's UID has the prefix, never deleted.
			if p := inst.Details[proxy.DetailUIDPrefix]; p != "" && !hasPrefix(uids, p) && !hasPrefix(releasedUIDs, p) && !tooYoung(inst, now) {
				res.found = append(res.found, inst)
			}
			continue
		}
		if inst.Mark.UID == "" || inst.Mark.InstallationID != cfg.InstallationID {
			continue
		}
		if r, live := uids[inst.Mark.UID]; live {
			// Its resource's, unless that records another instance: one
			// it left behind (made anew elsewhere under a changed
			// external name), which it never looks at again. Reported
			// only: its resource is live.
			if leftBehind(r, inst) && !tooYoung(inst, now) {
				res.found = append(res.found, inst)
			}
			continue
		}
		if releasedUIDs[inst.Mark.UID] {
			carried[inst.Mark.UID] = true
			res.released++
			continue
		}
		if disallowed[inst.Mark.UID] {
			carried[inst.Mark.UID] = true
		}
		unrecorded := mayBeUnrecorded(inst)
		unrecordedLeft = unrecordedLeft || unrecorded
		if inst.CreatedAt.IsZero() {
			// Of unknown age: reported, never deleted.
			res.found = append(res.found, inst)
			continue
		}
		age := now.Sub(inst.CreatedAt)
		if age < youngest {
			// Too new to tell: the resource that made it may not be in
			// the cache yet.
			continue
		}
		if policy == spec.OrphanPolicyDelete && age >= minAge {
			if unrecorded {
				res.withheld = append(res.withheld, inst)
				res.found = append(res.found, inst)
				continue
			}
			ref := proxy.Ref{ID: inst.ID, Name: inst.Name, Mark: inst.Mark, Placement: inst.Placement, Live: true}
			if err := d.Delete(ctx, ref); err != nil {
				s.Events.Event(pc, event.Warning(ReasonCannotDelete, errors.Wrapf(err, "cannot delete orphan %s", inst.ID)))
				res.found = append(res.found, inst)
				continue
			}
			res.deleted = append(res.deleted, inst)
			continue
		}
		res.found = append(res.found, inst)
	}
	slices.SortFunc(res.found, func(a, b proxy.Instance) int { return a.CreatedAt.Compare(b.CreatedAt) })
	if released != nil {
		res.keep = pruned(released, carried, unrecordedLeft, now)
	}
	if t, ok := d.(proxy.Tidier); ok {
		// Shared pieces no instance uses (KVM base images), under the
		// backend's own retention, whatever the orphan policy.
		removed, err := t.Tidy(ctx)
		for _, r := range removed {
			s.Events.Event(pc, event.Normal(ReasonTidied, "deleted "+r+": no proxy used it for the config's retention"))
		}
		if err != nil {
			s.Events.Event(pc, event.Warning(ReasonCannotTidy, errors.Wrap(err, "cannot tidy the backend")))
		}
	}
	return res, nil
}

// pruned returns what stays of the record r, or nil when nothing goes:
// the entries whose UID an instance still carries (carried) or released
// within settled, and unrecordedTime while an orphan that may be its
// instance is left (unrecordedLeft) or it is within settled.
func pruned(r *spec.ReleasedStatus, carried map[string]bool, unrecordedLeft bool, now time.Time) *spec.ReleasedStatus {
	keep := &spec.ReleasedStatus{UnrecordedTime: r.UnrecordedTime}
	for _, e := range r.Instances {
		if carried[e.UID] || now.Sub(e.ReleasedAt.Time) < settled {
			keep.Instances = append(keep.Instances, e)
		}
	}
	if t := r.UnrecordedTime; t != nil && !unrecordedLeft && now.Sub(t.Time) >= settled {
		keep.UnrecordedTime = nil
	}
	if len(keep.Instances) == len(r.Instances) && keep.UnrecordedTime == r.UnrecordedTime {
		return nil
	}
	return keep
}

// prune writes keep as the config's status.released, holding the
// resourceVersion the sweep read it at: a release recorded since fails the
// write with a conflict instead of being lost.
func (s *Sweeper) prune(ctx context.Context, pc config, keep *spec.ReleasedStatus) error {
	st, ok := statusOf(pc)
	if !ok {
		return nil
	}
	orig, ok := pc.DeepCopyObject().(config)
	if !ok {
		return errors.Errorf("cannot copy %T", pc)
	}
	st.Released = keep
	if len(keep.Instances) == 0 && keep.UnrecordedTime == nil {
		st.Released = nil
	}
	return errors.Wrap(client.IgnoreNotFound(s.Kube.Status().Patch(ctx, pc, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))), "cannot write status.released")
}

// liveResource is what the sweep reads of a live managed resource.
type liveResource struct {
	// id is the instance it records (status.atProvider.id; "" when none).
	id string
	// name is its external name, the name of the instance it looks at.
	name string
	// here: it uses the config being swept, whose IDs id is in.
	here bool
}

// leftBehind tells whether inst, carrying a live resource's UID, is not
// the instance that resource records. A resource of another config is
// compared by name only: that config may reach the same instance under
// another ID (a KVM host it names otherwise). Pieces without their
// instance are the resource's to delete.
func leftBehind(r liveResource, inst proxy.Instance) bool {
	if r.id == "" || inst.ID == "" || inst.ID == r.id || len(inst.Leftovers) > 0 {
		return false
	}
	return r.here || r.name != "" && inst.Name != r.name
}

// uses tells whether the managed resource o names pc as its config.
func uses(o runtime.Object, pc config) bool {
	switch m := o.(type) {
	case interface {
		metav1.Object
		GetProviderConfigReference() *xpv2.ProviderConfigReference
	}:
		ref := m.GetProviderConfigReference()
		if ref == nil || ref.Name != pc.GetName() {
			return false
		}
		switch pc.(type) {
		case *nsv1alpha1.ClusterProviderConfig:
			return ref.Kind == "ClusterProviderConfig"
		case *nsv1alpha1.ProviderConfig:
			return ref.Kind == "ProviderConfig" && m.GetNamespace() == pc.GetNamespace()
		}
	case interface {
		GetProviderConfigReference() *xpv2.Reference
	}:
		ref := m.GetProviderConfigReference()
		_, legacy := pc.(*clusterv1alpha1.ProviderConfig)
		return legacy && ref != nil && ref.Name == pc.GetName()
	}
	return false
}

// hasPrefix tells whether a UID in uids, without its dashes, starts with
// prefix.
func hasPrefix[V any](uids map[string]V, prefix string) bool {
	for u := range uids {
		if strings.HasPrefix(strings.ReplaceAll(u, "-", ""), prefix) {
			return true
		}
	}
	return false
}

// tooYoung tells whether inst is younger than youngest.
func tooYoung(inst proxy.Instance, now time.Time) bool {
	return !inst.CreatedAt.IsZero() && now.Sub(inst.CreatedAt) < youngest
}

// liveUIDs returns the UIDs of every managed resource of the backend's
// kinds, both scopes, each with what it records and whether it uses pc.
// A kind that cannot be listed (not active yet under safe start, no
// permission) fails the sweep: without it, its instances would all look
// orphaned.
func (s *Sweeper) liveUIDs(ctx context.Context, backend string, pc config) (map[string]liveResource, error) {
	kinds := s.Kinds[backend]
	if len(kinds) == 0 {
		return nil, errors.Errorf("no managed resource kind is known for the %s backend", backend)
	}
	uids := map[string]liveResource{}
	for _, gvk := range kinds {
		// The typed kind, which the manager's cache already holds for the
		// kind's controller: a list of metadata would be a second informer
		// of every resource. Only UIDs are read, so the cache's objects are
		// not copied.
		o, err := s.Kube.Scheme().New(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err != nil {
			return nil, errors.Wrapf(err, "cannot list %s to tell orphans from proxies", gvk.GroupKind())
		}
		l, ok := o.(client.ObjectList)
		if !ok {
			return nil, errors.Errorf("cannot list %s to tell orphans from proxies: %T is not a list", gvk.GroupKind(), o)
		}
		if err := s.Kube.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return nil, errors.Wrapf(err, "cannot list %s to tell orphans from proxies", gvk.GroupKind())
		}
		if err := apimeta.EachListItem(l, func(o runtime.Object) error {
			if m, ok := o.(metav1.Object); ok {
				r := liveResource{name: meta.GetExternalName(m), here: uses(o, pc)}
				if mr, ok := o.(interface{ Observation() *spec.ProxyObservation }); ok {
					r.id = mr.Observation().ID
				}
				uids[string(m.GetUID())] = r
			}
			return nil
		}); err != nil {
			return nil, errors.Wrapf(err, "cannot list %s to tell orphans from proxies", gvk.GroupKind())
		}
	}
	return uids, nil
}

// writeStatus records the sweep in status.orphans with a merge patch of
// the status subresource (only that field: the health and usage
// controllers write the rest).
func (s *Sweeper) writeStatus(ctx context.Context, pc config, found []proxy.Instance, released int, hosts, departed []spec.OrphanHost) error {
	now := metav1.NewTime(s.clock())
	st := spec.OrphanStatus{LastSweepTime: &now, Count: int32(len(found)), Released: int32(released), Hosts: hosts, DepartedHosts: departed} //nolint:gosec // Far fewer than 2^31 instances.
	for _, inst := range found {
		if len(st.Instances) == maxListed {
			break
		}
		o := spec.OrphanInstance{ID: inst.ID, Name: inst.Name, UID: inst.Mark.UID, Leftovers: inst.Leftovers}
		if inst.Mark.UID == "" {
			o.UIDPrefix = inst.Details[proxy.DetailUIDPrefix]
		}
		if !inst.CreatedAt.IsZero() {
			t := metav1.NewTime(inst.CreatedAt)
			o.CreatedAt = &t
		}
		st.Instances = append(st.Instances, o)
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		return err
	}
	// A merge patch keeps what it does not name: an emptied list is
	// removed explicitly.
	for _, k := range []string{"instances", "released", "hosts", "departedHosts"} {
		if _, ok := fields[k]; !ok {
			fields[k] = nil
		}
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"orphans": fields}})
	if err != nil {
		return err
	}
	return errors.Wrap(client.IgnoreNotFound(s.Kube.Status().Patch(ctx, pc, client.RawPatch(types.MergePatchType, patch))), "cannot write status.orphans")
}

// hostsOf is what the sweep remembers of the config's hosts (by name,
// with their addresses) from what it listed: each host with what of this
// installation stands on it; and the hosts that left the config since a
// sweep listed them with something on them (departed, kept from before;
// left, those found gone by this sweep), with what stood there then. A
// host back in the config is listed again and no longer departed.
func hostsOf(before *spec.OrphanStatus, configured map[string]string, listed []proxy.Instance, now time.Time) (hosts, departed, left []spec.OrphanHost) {
	t := metav1.NewTime(now)
	on := map[string][]string{}
	for _, i := range listed {
		if l := i.Placement.Location; l != "" {
			on[l] = append(on[l], i.Name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(configured)) {
		names := on[name]
		slices.Sort(names)
		h := spec.OrphanHost{Name: name, Address: configured[name], Count: int32(len(names)), LastListedTime: &t} //nolint:gosec // Far fewer than 2^31 instances.
		h.Instances = names[:min(len(names), maxListed)]
		hosts = append(hosts, h)
	}
	if before == nil {
		return hosts, nil, nil
	}
	for _, h := range before.DepartedHosts {
		if _, back := configured[h.Name]; !back {
			departed = append(departed, h)
		}
	}
	for _, h := range before.Hosts {
		if _, still := configured[h.Name]; still || h.Count == 0 || slices.ContainsFunc(departed, func(d spec.OrphanHost) bool { return d.Name == h.Name }) {
			continue
		}
		h.DepartedTime = &t
		departed = append(departed, h)
		left = append(left, h)
	}
	return hosts, departed, left
}

// statusOf returns the config's status, for each of the three config kinds.
func statusOf(pc config) (*spec.ProviderConfigStatus, bool) {
	s, ok := pc.(interface {
		ConfigStatus() *spec.ProviderConfigStatus
	})
	if !ok {
		return nil, false
	}
	return s.ConfigStatus(), true
}

func (s *Sweeper) configLabel(nn types.NamespacedName) string {
	if nn.Namespace == "" {
		return s.kind + "/" + nn.Name
	}
	return s.kind + "/" + nn.Namespace + "/" + nn.Name
}

func (s *Sweeper) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

func names(found []proxy.Instance) string {
	out := make([]string, 0, len(found))
	for i, f := range found {
		if i == 5 {
			out = append(out, fmt.Sprintf("and %d more", len(found)-i))
			break
		}
		out = append(out, f.ID)
	}
	return strings.Join(out, ", ")
}

// jitter spreads sweeps of configs created together by up to a tenth.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)/10+1)) //nolint:gosec // Jitter needs no secure randomness.
}
