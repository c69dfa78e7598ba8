package gcp

import (
	"context"
	"time"

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

// startSlack is how much earlier than the VM's last start a report may
// say it was made: its whole seconds and the guest's clock. A line of the
// settings before predates the stop too, which takes longer (the guest
// shuts down, Squid waits for its clients).
const startSlack = 5 * time.Second

// reportsCheck says the instance's metadata md applies a check whose
// report Get may read: guest attributes on and the check's request in
// metadata (or, from an instance made before metadata carried it, in its
// user-data). An attribute left from a check since turned off is never
// read.
func reportsCheck(md map[string]string) bool {
	if md[MetadataGuestAttributes] != "TRUE" {
		return false
	}
	return md[egressCheckKey(cloudinit.EgressCheckFiles(&cloudinit.EgressReport{})[0].Path)] != "" ||
		cloudinit.EgressRequestOf(md[MetadataUserData]) != ""
}

// readReport fills v from the guest's report of its egress check: a
// valid line from this instance's life (not older than its creation,
// give or take a minute of the guest's clock) that Squid answered inside
// the guest (an HTTP status, whether the check succeeded or not) makes
// the proxy count as reachable, and carries the address (Reported; the
// external address stays in BackendEgressIP, for the controller to
// compare) or why the check failed. Anything else (no attribute yet,
// guest attributes off, a malformed line, Squid not answering, a line
// from before the VM's last start) leaves v as it is. The guest's word is
// read strictly and never quoted.
//
// started is the instance's lastStartTimestamp. An update that changes
// the check restarts the VM, and the guest attribute outlives the
// restart: a line from before the start was made with the settings
// before.
func (d *Driver) readReport(ctx context.Context, zone, name string, v *proxy.Instance, started string) {
	ga, err := d.api.GetGuestAttribute(ctx, zone, name, cloudinit.GuestAttributeKey)
	if err != nil {
		return
	}
	r, ok, err := squid.GuestReport([]byte(ga.GetVariableValue()), v.CreatedAt, d.o.Now())
	if err != nil {
		d.log(ctx).V(1).Info("the guest's egress check report is not valid", "zone", zone, "name", name, "error", err.Error())
	}
	if !ok {
		return
	}
	if t, err := time.Parse(time.RFC3339Nano, started); err == nil && r.At.Before(t.Add(-startSlack)) {
		d.log(ctx).V(1).Info("the guest's egress check report predates the VM's last start", "zone", zone, "name", name)
		return
	}
	v.ProxyReachable, v.ReachableOnReport, v.Progress = true, true, ""
	r.Publish(v)
}
