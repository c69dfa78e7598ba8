package gcp

import (
	"context"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// The egress check from inside the instance (docs/allow-listing.md), for
// a proxy the provider cannot reach (a firewall admitting only the
// clients): the guest checks through its own Squid (cloudinit.EgressReport)
// and puts the line to its guest attribute cloudinit.GuestAttributeKey,
// which Get reads with instances.getGuestAttributes when its probe finds
// no Squid.

// MetadataGuestAttributes lets the guest write guest attributes; set only
// on an instance that reports its egress check.
const MetadataGuestAttributes = "enable-guest-attributes"

// egressReport is the guest's own check for req, nil when the config
// names none or an https echo URL (which the guest's bash cannot fetch).
func egressReport(req proxy.Request) *cloudinit.EgressReport {
	return cloudinit.ReportOf(req.Proxy, true)
}

// readReport fills v from the guest's report of its egress check: a
// valid address from this instance's life (not older than its creation,
// give or take a minute of the guest's clock)
// says Squid answered inside the guest, so the proxy counts as
// reachable, and the address is published as Reported. Anything else
// (no attribute yet, guest attributes off, a malformed line) leaves v as
// it is. The guest's word is read strictly and never quoted.
func (d *Driver) readReport(ctx context.Context, zone, name string, v *proxy.Instance) {
	ga, err := d.api.GetGuestAttribute(ctx, zone, name, cloudinit.GuestAttributeKey)
	if err != nil {
		return
	}
	ip, at, ok, err := squid.GuestReport([]byte(ga.GetVariableValue()), v.CreatedAt, d.o.Now())
	if err != nil {
		d.log(ctx).V(1).Info("the guest's egress check report is not valid", "zone", zone, "name", name, "error", err.Error())
	}
	if !ok {
		return
	}
	v.ProxyReachable, v.Progress = true, ""
	v.EgressIP, v.EgressSource, v.EgressCheckedAt = ip, proxy.EgressReported, at
}
