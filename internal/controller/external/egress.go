package external

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

const (
	// defaultEgressInterval is how often a Ready proxy's egress address is
	// checked again when the config says nothing.
	defaultEgressInterval = time.Hour
	// minEgressInterval keeps a config from making the check a load.
	minEgressInterval = time.Minute
	// egressCheckSalt separates the check credential's derivation from the
	// proxy user's (Passwords.For of the bare UID): a UID holds no '/'.
	egressCheckSalt = "egress-check/"
)

// Reasons of the EgressVerified condition.
const (
	reasonEgressVerified xpv2.ConditionReason = "Verified"
	reasonEgressReported xpv2.ConditionReason = "Reported"
	reasonEgressChanged  xpv2.ConditionReason = "Changed"
	reasonEgressDiffers  xpv2.ConditionReason = "Differs"
	reasonEgressFailed   xpv2.ConditionReason = "CheckFailed"
	reasonEgressPending  xpv2.ConditionReason = "Checking"
	reasonEgressNoPath   xpv2.ConditionReason = "Unreachable"
)

// egressCheck is the proxy's part of the config's egress check: its URL
// and the provider's own credential, derived from the resource's UID under
// the provider's key (never the proxy user's password; rotated with the
// key), or nil when the config names no check.
func (e *external[P]) egressCheck(ctx context.Context, uid string) (*proxy.EgressCheck, error) {
	b, _ := e.kind.Backend.Block(&e.cfg.Spec)
	if b.EgressCheck == nil || b.EgressCheck.URL == "" {
		return nil, nil //nolint:nilnil // No check is not an error.
	}
	pw, err := e.passwords.For(ctx, egressCheckSalt+uid)
	if err != nil {
		return nil, errors.Wrap(err, "cannot derive the egress check credential")
	}
	return &proxy.EgressCheck{URL: b.EgressCheck.URL, Username: squid.CheckUsername, Password: pw}, nil
}

// egressInterval is the config's egressCheck.interval, bounded.
func (e *external[P]) egressInterval() time.Duration {
	b, _ := e.kind.Backend.Block(&e.cfg.Spec)
	if b.EgressCheck == nil || b.EgressCheck.Interval == nil {
		return defaultEgressInterval
	}
	return max(b.EgressCheck.Interval.Duration, minEgressInterval)
}

// egressBefore is what status said of the egress address before this
// reconcile's observation replaced it.
type egressBefore struct {
	ip, source string
	ips        []string
	at         *metav1.Time
	// through is the route the address was checked through (egressRoute).
	through string
	// with is the echo URL that saw it; empty when status did not say.
	with string
	// id and created are the instance status described.
	id      string
	created *metav1.Time
	// replaced are the addresses checked of an instance since replaced
	// or moved (egressIPsBefore), while its own are not checked yet.
	replaced []string
}

func egressOf(o *spec.ProxyObservation) egressBefore {
	through := o.EgressIPCheckedThrough
	if through == "" && o.EgressIP != "" {
		// A status written before the route was: the instance as it
		// described it then, without the backend's figure.
		through = routeOf(o.IP, "")
	}
	return egressBefore{ip: o.EgressIP, ips: o.EgressIPs, source: o.EgressIPSource, at: o.EgressIPVerifiedAt, through: through, with: o.EgressIPCheckedWith, id: o.ID, created: o.CreatedAt,
		replaced: o.EgressIPsBefore}
}

// egressRoute is what an egress check of inst goes through, and what its
// answer holds for; another route's answer says nothing of inst's address.
// A VM's (KVM, Proxmox) is its guest address, where the probe and the
// check connect; a GCP instance's its external NAT IP, which is both its
// address and the backend's figure; a PodProxy's the address clients use,
// its Service's (or the pod's, without one). A pod replaced behind its
// Service is the same route: a rollout keeps the address checked until a
// check says otherwise, as the clients behind the Service see it. Where
// the check goes through each replica (a PodProxy's pods, reached one by
// one), their addresses are part of it too: the answer holds for those
// pods alone, and pods replaced on other nodes may leave from others.
func egressRoute(inst proxy.Instance) string {
	r := instanceRoute(inst)
	if len(inst.Replicas) > 1 {
		replicas := inst.Replicas[:min(len(inst.Replicas), maxEgressReplicas)]
		addrs := make([]string, len(replicas))
		for i, rep := range replicas {
			addrs[i] = rep.ProxyAddress
		}
		slices.Sort(addrs)
		r += " replicas " + strings.Join(addrs, ",")
	}
	return r
}

// instanceRoute is egressRoute without the replicas: what names the
// instance and its address to the checker, whose keys are per replica.
func instanceRoute(inst proxy.Instance) string {
	backend := inst.BackendEgressIP
	if backend == inst.IP {
		backend = ""
	}
	return routeOf(inst.IP, backend)
}

func routeOf(ip, backend string) string {
	r := ip
	if backend != "" {
		r += " backend " + backend
	}
	return r
}

// sameRoute reports whether the address status held was checked through
// inst as it stands (egressRoute): only then does a failed or pending
// check leave it published. The checker remembers this too, but not
// across a restart of the provider.
func (b egressBefore) sameRoute(inst proxy.Instance) bool {
	return b.sameInstance(inst) && b.through == egressRoute(inst)
}

// sameAddress reports whether the address status held was checked
// through inst at the address, and with the backend's figure, inst has
// now (instanceRoute): replicas aside, which a proxy that does not answer
// may not list.
func (b egressBefore) sameAddress(inst proxy.Instance) bool {
	through, _, _ := strings.Cut(b.through, " replicas ")
	return through == instanceRoute(inst)
}

// sameURL reports whether the address status held was seen by url, the
// echo URL the config names now: another URL's answer is not this one's
// word, and a status that does not say which URL saw it cannot tell.
func (b egressBefore) sameURL(url string) bool {
	return b.with != "" && b.with == url
}

// sameInstance reports whether status described inst: an address checked
// through another instance (a recreated VM, a replaced Deployment) says
// nothing of this one's.
func (b egressBefore) sameInstance(inst proxy.Instance) bool {
	if b.id != inst.ID {
		return false
	}
	if b.created == nil || inst.CreatedAt.IsZero() {
		return b.created == nil && inst.CreatedAt.IsZero()
	}
	return b.created.Time.Equal(inst.CreatedAt.Truncate(time.Second)) || b.created.Time.Equal(inst.CreatedAt)
}

// addresses are the egress addresses status held: egressIPs, or egressIP
// alone where an older status has no list.
func (b egressBefore) addresses() []string {
	if len(b.ips) == 0 && b.ip != "" {
		return []string{b.ip}
	}
	return b.ips
}

// setEgress fills the egress part of status (already set from inst by
// setObservation) and inst.EgressIP and EgressIPs, which the connection
// Secret's egressIP and egressIPs are read from: the address the check saw
// through the proxy (each of its replicas) when the config names one and
// the provider reaches the proxy, else the instance's reported check
// unless it differs from the backend's own figure, else that figure where
// it is the egress address. It sets the EgressVerified condition, with an
// event when the address changes or differs from the backend's figure (a
// reserved address), and removes it when the config names no check.
func (e *external[P]) setEgress(ctx context.Context, cr Resource[P], inst *proxy.Instance, req proxy.Request, before egressBefore) {
	check := req.Proxy.EgressCheck
	o := cr.Observation()
	o.EgressIP, o.EgressIPs, o.EgressIPSource, o.EgressIPVerifiedAt, o.EgressIPCheckedThrough, o.EgressIPCheckedWith = inst.EgressIP, nil, "", nil, "", ""
	// The addresses of a replaced instance stay until its successor's are
	// checked (or the check is turned off): see replacedBy.
	o.EgressIPsBefore = nil
	if check != nil {
		o.EgressIPsBefore = before.replaced
	}
	defer func() {
		if o.EgressIPSource == spec.EgressIPVerified || o.EgressIPSource == spec.EgressIPReported {
			// Checked: a change from them is told now or never.
			o.EgressIPsBefore = nil
		}
		if len(o.EgressIPs) == 0 && o.EgressIP != "" {
			o.EgressIPs = []string{o.EgressIP}
		}
		inst.EgressIPs = o.EgressIPs
	}()
	switch inst.EgressSource {
	case proxy.EgressBackend:
		o.EgressIPSource = spec.EgressIPBackend
	case proxy.EgressReported:
		o.EgressIPSource = spec.EgressIPReported
		if !inst.EgressCheckedAt.IsZero() {
			t := metav1.NewTime(inst.EgressCheckedAt)
			o.EgressIPVerifiedAt = &t
		}
	}
	if check == nil {
		// The condition says what a check found: without one it is absent.
		removeCondition(cr, xpv2.ConditionType(spec.TypeEgressVerified))
		return
	}
	if e.egress == nil {
		return
	}
	backendIP := inst.BackendEgressIP
	ready := inst.State == proxy.StateRunning && inst.ProxyReachable
	// Whatever says nothing new of the egress address (a probe that failed
	// once, a rollout, a check pending or failed) leaves the one last
	// verified, so that the next check tells whether it changed; unless it
	// was verified of another instance. (A check that failed after the
	// backend's own figure changed keeps nothing either: squid's Moved.)
	// A failed or pending check keeps it only when it was checked through
	// the same route (sameRoute) with the URL the config names now
	// (sameURL).
	checked := before.source == spec.EgressIPVerified || before.source == spec.EgressIPReported
	keepIf := func(ok bool) {
		if !checked || !before.sameURL(check.URL) {
			return
		}
		if !ok {
			// Not this instance's, or not through its route, any more:
			// its successor's first check is compared with it.
			o.EgressIPsBefore = replacedBy(before, check.URL)
			return
		}
		o.EgressIP, o.EgressIPs, o.EgressIPSource, o.EgressIPVerifiedAt = before.ip, before.ips, before.source, before.at
		o.EgressIPCheckedThrough, o.EgressIPCheckedWith = before.through, before.with
		inst.EgressIP = o.EgressIP
	}
	keep := func() { keepIf(before.sameRoute(*inst)) }
	var c xpv2.Condition
	switch {
	case !ready && checked && !before.sameInstance(*inst):
		// A recreated instance booting: the address checked was the
		// last one's, kept to compare its successor's with.
		o.EgressIPsBefore = replacedBy(before, check.URL)
		c = egressCondition(corev1.ConditionUnknown, reasonEgressPending, "a new instance replaced the one whose egress address was checked; its own is checked once its proxy answers")
	case !ready && checked && inst.IP != "" && !before.sameAddress(*inst):
		// Booting where the backend names another address (an
		// ephemeral address after a stop, a pod on another node): the
		// address checked was the old one's.
		o.EgressIPsBefore = replacedBy(before, check.URL)
		c = egressCondition(corev1.ConditionUnknown, reasonEgressPending, "the instance's address changed since its egress address was checked; the new one is checked once its proxy answers")
	case !ready && checked && !before.sameURL(check.URL):
		// The address was another URL's word (or status does not say
		// whose): neither it nor its condition stays.
		c = egressCondition(corev1.ConditionUnknown, reasonEgressPending, "the egress address was not checked with "+shownURL(check.URL)+", which the config names now; it is checked once the proxy answers")
	case !ready:
		// A probe that fails says nothing of a move: the next check
		// compares with the route the address was checked through.
		keepIf(before.sameInstance(*inst))
		return
	case inst.ProxyAddress == "" && inst.EgressFailure != "":
		keep()
		c = egressCondition(corev1.ConditionFalse, reasonEgressFailed, fmt.Sprintf("the egress check from inside the instance with %s failed%s: %s", shownURL(check.URL), reportedAt(inst), inst.EgressFailure))
	case inst.ProxyAddress == "" && inst.EgressSource == proxy.EgressReported:
		o.EgressIPCheckedThrough, o.EgressIPCheckedWith = egressRoute(*inst), check.URL
		c = e.reported(cr, inst, backendIP, before)
		if c.Reason == reasonEgressDiffers {
			// The instance's word does not stand against the backend's
			// own figure: that stays published.
			o.EgressIP, o.EgressIPs, o.EgressIPSource, o.EgressIPVerifiedAt, o.EgressIPCheckedThrough, o.EgressIPCheckedWith = backendIP, nil, spec.EgressIPBackend, nil, "", ""
		}
	case inst.ProxyAddress == "":
		keep()
		c = egressCondition(corev1.ConditionUnknown, reasonEgressNoPath, "the provider cannot reach the proxy to send the egress check through it, and the backend reports no check from inside the instance")
	default:
		// A recreated instance is checked at once, and so is one whose
		// address the backend says changed (an ephemeral address after a
		// restart, which restarts its Squid too); one updated in place
		// as soon as squid.IdleConnectionGap allows.
		// Before the '#': the instance and its address, whose change is a
		// move (squid.EgressChecker.Check).
		version := inst.ID + "@" + inst.CreatedAt.UTC().Format(time.RFC3339Nano) + "/" + instanceRoute(*inst) + "#" + inst.SpecHash
		r, ips := e.checkEgress(ctx, string(cr.GetUID()), version, *inst, *check, e.cfg.ReportedGuard(req.TenantGuest))
		// Looked at when the next check is due, or when the check in
		// flight has answered, not up to a poll late: the hint counts
		// only when sooner than the poll (retryAfter).
		if r.Next.IsZero() {
			e.hints.noteSoon(cr, e.egress.CheckTimeout())
		} else {
			e.hints.noteSoon(cr, max(time.Until(r.Next), time.Second))
		}
		switch {
		case r.IP == "" && r.Error == "":
			keepIf(!r.Moved && before.sameRoute(*inst))
			c = egressCondition(corev1.ConditionUnknown, reasonEgressPending, "checking the egress address through the proxy with "+shownURL(check.URL))
		case r.IP == "":
			keepIf(!r.Moved && before.sameRoute(*inst))
			c = egressCondition(corev1.ConditionFalse, reasonEgressFailed, fmt.Sprintf("the egress check through the proxy with %s failed: %s", shownURL(r.URL), r.Error))
		default:
			at := metav1.NewTime(r.At)
			o.EgressIP, o.EgressIPs, o.EgressIPSource, o.EgressIPVerifiedAt = r.IP, ips, spec.EgressIPVerified, &at
			o.EgressIPCheckedThrough, o.EgressIPCheckedWith = egressRoute(*inst), r.URL
			c = e.verified(cr, r, ips, backendIP, before)
		}
	}
	inst.EgressIP = o.EgressIP
	if n := inst.ServingReplicas; n > 1 && (c.Reason == reasonEgressVerified || c.Reason == reasonEgressReported || c.Reason == reasonEgressChanged) {
		// A Changed condition kept from before carries it already.
		if note := fmt.Sprintf("; the proxy has %d replicas and the check sees one at a time (through its load balancer, or one pod's report): replicas on nodes that leave from other addresses are not in the list (docs/allow-listing.md)", n); !strings.HasSuffix(c.Message, note) {
			c.Message += note
		}
	}
	e.setEgressCondition(cr, c)
}

// shownURL is an echo URL as a condition quotes it: not at all when it
// holds user info, a query or a fragment, which may be a credential (a
// config stored before admission refused them; squid.Validate refuses
// them too).
func shownURL(url string) string {
	if strings.ContainsAny(url, "@?#") {
		return "the config's egressCheck.url (not shown: it holds user info, a query or a fragment, which are refused; remove them)"
	}
	return url
}

// standingReport drops from inst the report from inside it of its egress
// check that is not the instance's word on the settings req names, for
// every backend, before status is filled (a driver may refuse such a
// report itself too). A report left behind by a check the config no
// longer names, or made before the instance's last start (an update
// restarts a VM, and its report may outlive that until the guest writes
// the next), goes with the reachability resting on it. One read while
// the instance does not run req's settings (an update pending or in this
// very call, changing) may be of another echo URL: its address and
// failure go, and Squid's answer inside still stands for the probe.
func standingReport(inst *proxy.Instance, req proxy.Request, changing bool) {
	if inst.EgressSource != proxy.EgressReported && inst.EgressFailure == "" && !inst.ReachableOnReport {
		return
	}
	why := ""
	switch {
	case req.Proxy.EgressCheck == nil:
		why = "the config names no egress check"
	case inst.ReportPredatesStart(inst.EgressCheckedAt):
		why = "its report of the egress check predates the instance's last start"
	case changing || (inst.SpecHash != "" && inst.SpecHash != proxy.Hash(req)):
	default:
		return
	}
	if inst.EgressSource == proxy.EgressReported {
		inst.EgressIP, inst.EgressSource = "", ""
		if inst.BackendEgressIP != "" {
			inst.EgressIP, inst.EgressSource = inst.BackendEgressIP, proxy.EgressBackend
		}
	}
	inst.EgressCheckedAt, inst.EgressFailure = time.Time{}, ""
	if inst.ReachableOnReport && why != "" {
		inst.ProxyReachable, inst.ReachableOnReport = false, false
		msg := "waiting for Squid to answer: the provider's probe finds none, and " + why
		if inst.Progress != "" {
			msg = inst.Progress + "; " + msg
		}
		inst.Progress = msg
	}
}

// checkEgress runs the egress check through inst's proxy, or through each
// of its replicas where the provider reaches several (each under a key of
// its own, the first the resource's UID as for one replica), and merges
// what they saw: IP the first of the sorted addresses, At the oldest
// check, Error the first failure naming its replica, Next zero while a
// replica's check is in flight; no IP while a replica has none yet. ips
// are every address seen, sorted.
func (e *external[P]) checkEgress(ctx context.Context, uid, version string, inst proxy.Instance, check proxy.EgressCheck, guard *netguard.Guard) (squid.Egress, []string) {
	if len(inst.Replicas) < 2 {
		r := e.egress.Check(ctx, guard.Reported(), uid, version, inst.ProxyAddress, check, e.egressInterval())
		if r.IP == "" {
			return r, nil
		}
		return r, []string{r.IP}
	}
	replicas := inst.Replicas[:min(len(inst.Replicas), maxEgressReplicas)]
	results := make([]squid.Egress, len(replicas))
	var wg sync.WaitGroup
	for i, rep := range replicas {
		wg.Go(func() {
			results[i] = e.egress.Check(ctx, guard.Reported(), replicaKey(uid, i), version, rep.ProxyAddress, check, e.egressInterval())
		})
	}
	wg.Wait()
	// Every replica's check asks the same URL.
	merged := squid.Egress{URL: results[0].URL}
	var ips []string
	inFlight := false
	for i, r := range results {
		inFlight = inFlight || r.Next.IsZero()
		if !r.Next.IsZero() && (merged.Next.IsZero() || r.Next.Before(merged.Next)) {
			merged.Next = r.Next
		}
		merged.Moved = merged.Moved || r.Moved
		if r.Error != "" && merged.Error == "" {
			merged.Error = fmt.Sprintf("through replica %s: %s", replicas[i].Name, r.Error)
		}
		if r.IP == "" {
			ips = nil
			break
		}
		ips = append(ips, r.IP)
		if merged.At.IsZero() || r.At.Before(merged.At) {
			merged.At = r.At
		}
	}
	if inFlight {
		merged.Next = time.Time{}
	}
	if len(ips) < len(results) {
		return squid.Egress{URL: merged.URL, Error: merged.Error, Moved: merged.Moved, Next: merged.Next}, nil
	}
	slices.Sort(ips)
	ips = slices.Compact(ips)
	merged.IP = ips[0]
	return merged, ips
}

// verified is the condition of a check that saw ips (r.IP the first),
// naming the URL that saw them.
func (e *external[P]) verified(cr Resource[P], r squid.Egress, ips []string, backendIP string, before egressBefore) xpv2.Condition {
	seen := fmt.Sprintf("%s saw %s through the proxy at %s", shownURL(r.URL), r.IP, r.At.UTC().Format(time.RFC3339))
	if len(ips) > 1 {
		seen = fmt.Sprintf("%s saw %s through the proxy's replicas (on several nodes: put every one on the allow-list) at %s", shownURL(r.URL), strings.Join(ips, ", "), r.At.UTC().Format(time.RFC3339))
	}
	if r.Error != "" {
		return egressCondition(corev1.ConditionFalse, reasonEgressFailed, fmt.Sprintf("the latest egress check failed (%s); %s", r.Error, seen))
	}
	if backendIP != "" && backendIP != r.IP {
		return egressCondition(corev1.ConditionFalse, reasonEgressDiffers, fmt.Sprintf("%s, but the backend says the instance's address is %s: the vendor sees %s, not %s", seen, backendIP, r.IP, backendIP))
	}
	if c, ok := e.changed(cr, ips, seen, before); ok {
		return c
	}
	return egressCondition(corev1.ConditionTrue, reasonEgressVerified, seen)
}

// reported is the condition of an address the instance reported of a
// check from inside it; Differs when the backend's own figure, backendIP,
// is another.
func (e *external[P]) reported(cr Resource[P], inst *proxy.Instance, backendIP string, before egressBefore) xpv2.Condition {
	seen := "the check from inside the instance saw " + inst.EgressIP + reportedAt(inst)
	if backendIP != "" && backendIP != inst.EgressIP {
		return egressCondition(corev1.ConditionFalse, reasonEgressDiffers, fmt.Sprintf("%s, but the backend says the instance's address is %s: %s stays published, not what the instance reports", seen, backendIP, backendIP))
	}
	if c, ok := e.changed(cr, []string{inst.EgressIP}, seen, before); ok {
		return c
	}
	return egressCondition(corev1.ConditionTrue, reasonEgressReported, seen)
}

// replacedBy are the addresses status checked (before) of an instance
// being replaced, which its successor's first check is compared with:
// none when another echo URL saw them, whose word is not this one's.
func replacedBy(before egressBefore, url string) []string {
	if !before.sameURL(url) {
		return nil
	}
	return slices.Clone(before.addresses())
}

// changed is the Changed condition when ips are not the addresses checked
// before (of this instance, or of the one it replaced: egressIPsBefore),
// or kept for an interval after a change, so that the change can be
// read: the checks an instance's changes bring (a rollout brings
// several) do not hide it at once.
func (e *external[P]) changed(cr Resource[P], ips []string, seen string, before egressBefore) (xpv2.Condition, bool) {
	was := cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
	checked := before.source == spec.EgressIPVerified || before.source == spec.EgressIPReported
	if !checked && len(before.replaced) > 0 {
		// The first check of a replacement (status holds none, or the
		// backend's figure): against its predecessor's.
		before.ip, before.ips, checked = before.replaced[0], before.replaced, true
	}
	switch {
	case len(ips) == 1 && len(before.addresses()) < 2 && before.ip != "" && before.ip != ips[0] && checked:
		return egressCondition(corev1.ConditionTrue, reasonEgressChanged, fmt.Sprintf("the egress address changed from %s to %s: %s", before.ip, ips[0], seen)), true
	case before.ip != "" && !slices.Equal(before.addresses(), ips) && checked:
		return egressCondition(corev1.ConditionTrue, reasonEgressChanged, fmt.Sprintf("the egress addresses changed from %s to %s: %s", strings.Join(before.addresses(), ", "), strings.Join(ips, ", "), seen)), true
	case was.Reason == reasonEgressChanged && slices.Equal(before.addresses(), ips) && time.Since(was.LastTransitionTime.Time) < e.egressInterval():
		return was, true
	}
	return xpv2.Condition{}, false
}

// reportedAt is " at <time>" of the instance's reported check, "" when
// the backend gave no time.
func reportedAt(inst *proxy.Instance) string {
	if inst.EgressCheckedAt.IsZero() {
		return ""
	}
	return " at " + inst.EgressCheckedAt.UTC().Format(time.RFC3339)
}

// removeCondition removes cr's condition of type t. crossplane-runtime
// sets conditions but removes none, and the generated kinds offer no more
// than GetCondition and SetConditions, so the list is taken where every
// managed resource keeps it: Status.ConditionedStatus.
func removeCondition(cr resource.Managed, t xpv2.ConditionType) {
	if cr.GetCondition(t).Reason == "" {
		return // absent: the provider's conditions all have a reason.
	}
	v := reflect.ValueOf(cr)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return
	}
	st := v.Elem().FieldByName("Status")
	if st.Kind() != reflect.Struct {
		return
	}
	f := st.FieldByName("ConditionedStatus")
	if !f.IsValid() || !f.CanAddr() {
		return
	}
	cs, ok := f.Addr().Interface().(*xpv2.ConditionedStatus)
	if !ok {
		return
	}
	cs.Conditions = slices.DeleteFunc(cs.Conditions, func(c xpv2.Condition) bool { return c.Type == t })
}

func egressCondition(s corev1.ConditionStatus, r xpv2.ConditionReason, msg string) xpv2.Condition {
	return xpv2.Condition{Type: xpv2.ConditionType(spec.TypeEgressVerified), Status: s, Reason: r, Message: msg, LastTransitionTime: metav1.Now()}
}

// setEgressCondition sets c, with a Warning event when the address
// changed, differs from the backend's figure, or cannot be checked.
func (e *external[P]) setEgressCondition(cr Resource[P], c xpv2.Condition) {
	was := cr.GetCondition(c.Type)
	cr.SetConditions(c.WithObservedGeneration(cr.GetGeneration()))
	if e.record == nil || (was.Reason == c.Reason && was.Message == c.Message) {
		return
	}
	switch c.Reason {
	case reasonEgressChanged:
		e.record.Event(cr, event.Event{Type: event.TypeWarning, Reason: "EgressIPChanged", Message: c.Message})
	case reasonEgressDiffers:
		e.record.Event(cr, event.Event{Type: event.TypeWarning, Reason: "EgressIPDiffers", Message: c.Message})
	case reasonEgressFailed:
		if was.Reason != c.Reason {
			e.record.Event(cr, event.Event{Type: event.TypeWarning, Reason: "EgressCheckFailed", Message: c.Message})
		}
	case reasonEgressVerified:
		if was.Reason != c.Reason {
			e.record.Event(cr, event.Event{Type: event.TypeNormal, Reason: "EgressIPVerified", Message: c.Message})
		}
	}
}

// maxEgressReplicas bounds the replicas of one proxy the egress check goes
// through (a PodProxy has at most 10).
const maxEgressReplicas = 16

// replicaKey is the checker's key of a proxy's replica i: the resource's
// UID for the first, as for a proxy of one.
func replicaKey(uid string, i int) string {
	if i == 0 {
		return uid
	}
	return uid + "/" + strconv.Itoa(i)
}

// forgetEgress drops what the checker keeps of cr's proxy (it is gone or
// going), of every replica.
func (e *external[P]) forgetEgress(cr Resource[P]) {
	if e.egress != nil {
		for i := range maxEgressReplicas {
			e.egress.Forget(replicaKey(string(cr.GetUID()), i))
		}
	}
}
