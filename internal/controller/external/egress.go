package external

import (
	"context"
	"fmt"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
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
	at         *metav1.Time
}

func egressOf(o *spec.ProxyObservation) egressBefore {
	return egressBefore{ip: o.EgressIP, source: o.EgressIPSource, at: o.EgressIPVerifiedAt}
}

// setEgress fills the egress part of status (already set from inst by
// setObservation) and inst.EgressIP, which the connection Secret's
// egressIP is read from: the address the check saw through the proxy when
// the config names one and the provider reaches the proxy, else the
// instance's reported check, else the backend's own figure where that is
// the egress address. It sets the EgressVerified condition, with an event
// when the address changes or differs from the backend's figure (a
// reserved address).
func (e *external[P]) setEgress(ctx context.Context, cr Resource[P], inst *proxy.Instance, req proxy.Request, before egressBefore) {
	o := cr.Observation()
	o.EgressIP, o.EgressIPSource, o.EgressIPVerifiedAt = inst.EgressIP, "", nil
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
	check := req.Proxy.EgressCheck
	if check == nil || e.egress == nil {
		return
	}
	backendIP := ""
	if inst.EgressSource == proxy.EgressBackend {
		backendIP = inst.EgressIP
	}
	ready := inst.State == proxy.StateRunning && inst.ProxyReachable
	// Whatever says nothing new of the egress address (a probe that failed
	// once, a rollout, a check pending or failed) leaves the one last
	// verified, so that the next check tells whether it changed.
	keep := func() {
		if before.source == spec.EgressIPVerified || before.source == spec.EgressIPReported {
			o.EgressIP, o.EgressIPSource, o.EgressIPVerifiedAt = before.ip, before.source, before.at
			inst.EgressIP = o.EgressIP
		}
	}
	var c xpv2.Condition
	switch {
	case !ready:
		keep()
		return
	case inst.ProxyAddress == "" && inst.EgressSource == proxy.EgressReported:
		c = e.reported(cr, inst, before)
	case inst.ProxyAddress == "":
		keep()
		c = egressCondition(corev1.ConditionUnknown, reasonEgressNoPath, "the provider cannot reach the proxy to send the egress check through it, and the backend reports no check from inside the instance")
	default:
		// A recreated or updated instance is checked at once.
		version := inst.ID + "@" + inst.CreatedAt.UTC().Format(time.RFC3339Nano) + "#" + inst.SpecHash
		r := e.egress.Check(ctx, string(cr.GetUID()), version, inst.ProxyAddress, *check, e.egressInterval())
		switch {
		case r.IP == "" && r.Error == "":
			keep()
			c = egressCondition(corev1.ConditionUnknown, reasonEgressPending, "checking the egress address through the proxy with "+check.URL)
		case r.IP == "":
			keep()
			c = egressCondition(corev1.ConditionFalse, reasonEgressFailed, fmt.Sprintf("the egress check through the proxy with %s failed: %s", check.URL, r.Error))
		default:
			at := metav1.NewTime(r.At)
			o.EgressIP, o.EgressIPSource, o.EgressIPVerifiedAt = r.IP, spec.EgressIPVerified, &at
			c = e.verified(cr, r, check.URL, backendIP, before)
		}
	}
	inst.EgressIP = o.EgressIP
	e.setEgressCondition(cr, c)
}

// verified is the condition of a check that saw r.IP.
func (e *external[P]) verified(cr Resource[P], r squid.Egress, url, backendIP string, before egressBefore) xpv2.Condition {
	seen := fmt.Sprintf("%s saw %s through the proxy at %s", url, r.IP, r.At.UTC().Format(time.RFC3339))
	if r.Error != "" {
		return egressCondition(corev1.ConditionFalse, reasonEgressFailed, fmt.Sprintf("the latest egress check failed (%s); %s", r.Error, seen))
	}
	if backendIP != "" && backendIP != r.IP {
		return egressCondition(corev1.ConditionFalse, reasonEgressDiffers, fmt.Sprintf("%s, but the backend says the instance's address is %s: the vendor sees %s, not %s", seen, backendIP, r.IP, backendIP))
	}
	if c, ok := e.changed(cr, r.IP, seen, before); ok {
		return c
	}
	return egressCondition(corev1.ConditionTrue, reasonEgressVerified, seen)
}

// reported is the condition of an address the instance reported of a
// check from inside it.
func (e *external[P]) reported(cr Resource[P], inst *proxy.Instance, before egressBefore) xpv2.Condition {
	seen := fmt.Sprintf("the check from inside the instance saw %s", inst.EgressIP)
	if !inst.EgressCheckedAt.IsZero() {
		seen += " at " + inst.EgressCheckedAt.UTC().Format(time.RFC3339)
	}
	if c, ok := e.changed(cr, inst.EgressIP, seen, before); ok {
		return c
	}
	return egressCondition(corev1.ConditionTrue, reasonEgressReported, seen)
}

// changed is the Changed condition when ip is not the address checked
// before, or kept for an interval after a change, so that the change can
// be read: the checks an instance's changes bring (a rollout brings
// several) do not hide it at once.
func (e *external[P]) changed(cr Resource[P], ip, seen string, before egressBefore) (xpv2.Condition, bool) {
	was := cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
	switch {
	case before.ip != "" && before.ip != ip && (before.source == spec.EgressIPVerified || before.source == spec.EgressIPReported):
		return egressCondition(corev1.ConditionTrue, reasonEgressChanged, fmt.Sprintf("the egress address changed from %s to %s: %s", before.ip, ip, seen)), true
	case was.Reason == reasonEgressChanged && before.ip == ip && time.Since(was.LastTransitionTime.Time) < e.egressInterval():
		return was, true
	}
	return xpv2.Condition{}, false
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

// forgetEgress drops what the checker keeps of cr's proxy (it is gone or
// going).
func (e *external[P]) forgetEgress(cr Resource[P]) {
	if e.egress != nil {
		e.egress.Forget(string(cr.GetUID()))
	}
}
