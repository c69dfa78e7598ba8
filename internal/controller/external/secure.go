package external

import (
	"fmt"
	"net/netip"

	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Reasons of the Secure condition of a proxy.
const (
	reasonSecureTLS            xpv2.ConditionReason = "TLS"
	reasonNoCredentialsExposed xpv2.ConditionReason = "NoCredentialsExposed"
	reasonCredentialsInClear   xpv2.ConditionReason = "CredentialsInClear"
)

// cgnat is RFC 6598's shared address space: carrier-grade NAT, not the
// internet, though netip calls it neither private nor special.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// publicIP reports whether ip is an address of the internet.
func publicIP(ip string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	a = a.Unmap()
	return a.IsGlobalUnicast() && !a.IsPrivate() && !cgnat.Contains(a)
}

// setSecure sets the Secure condition: whether the proxy's credentials
// cross a public network in clear (auth on, no TLS, a public listener),
// with a Warning event when it turns False.
func (e *external[P]) setSecure(cr Resource[P], inst proxy.Instance, req proxy.Request) {
	where := ""
	if e.kind.PublicListener != nil {
		where = e.kind.PublicListener(cr.Parameters())
	}
	if where == "" && publicIP(inst.IP) {
		where = "the public address " + inst.IP
	}
	c := xpv2.Condition{Type: spec.TypeSecure, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}
	switch {
	case req.Proxy.TLS != nil:
		c.Reason, c.Message = reasonSecureTLS, "clients connect to the proxy with TLS (https://); the connection Secret's ca.crt verifies it"
	case !req.Proxy.Auth.Enabled:
		c.Reason, c.Message = reasonNoCredentialsExposed, "auth is off: no credentials cross the network (the proxy admits clients by address)"
	case where == "":
		c.Reason, c.Message = reasonNoCredentialsExposed, "the proxy listens without TLS, on no public address: its credentials cross only the network the proxy stands in (set spec.forProvider.proxy.tls to encrypt them)"
	default:
		c.Status, c.Reason = corev1.ConditionFalse, reasonCredentialsInClear
		c.Message = fmt.Sprintf("auth is on, but the proxy listens on %s without TLS: the password crosses the internet in clear with every request; set spec.forProvider.proxy.tls to a Secret with tls.crt and tls.key (cert-manager's), or keep the listener private", where)
	}
	was := cr.GetCondition(spec.TypeSecure)
	cr.SetConditions(c.WithObservedGeneration(cr.GetGeneration()))
	if e.record != nil && c.Status == corev1.ConditionFalse && (was.Status != c.Status || was.Reason != c.Reason) {
		e.record.Event(cr, event.Event{Type: event.TypeWarning, Reason: event.Reason(c.Reason), Message: c.Message})
	}
}
