package proxmox

import (
	"context"
	"strings"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// The egress check from inside the guest (docs/allow-listing.md), for a
// proxy the provider cannot reach (a bridge without a route from the
// provider, a firewall): the guest checks through its own Squid
// (cloudinit.EgressReport) and keeps the line in cloudinit.ReportPath,
// which Get reads through the guest agent (agent/file-read) when its
// probe finds no Squid.

// reachableOrReported is reachable, with the guest's own check read when
// the probe found no Squid.
func (d *Driver) reachableOrReported(ctx context.Context, e Resource, inst proxy.Instance, ip string, port int, ca string, guard *netguard.Guard) proxy.Instance {
	before := inst.Progress
	inst = d.reachable(ctx, inst, ip, port, ca, guard)
	if inst.ProxyReachable || !strings.Contains(inst.Progress, "waiting for Squid to answer: ") {
		return inst
	}
	content, truncated, err := d.api.AgentFileRead(ctx, e.Node, e.VMID, cloudinit.ReportPath)
	if err != nil || truncated || len(content) > squid.MaxReport {
		return inst
	}
	r, ok, err := squid.GuestReport([]byte(content), inst.CreatedAt, d.now())
	if err != nil {
		d.logger(ctx).V(1).Info("the guest's egress check report is not valid", "node", e.Node, "vmid", e.VMID, "error", err.Error())
	}
	if !ok {
		return inst
	}
	// Squid answered inside the guest (whether the check succeeded or
	// not): the guest's word stands for the probe.
	inst.ProxyReachable, inst.ReachableOnReport, inst.Progress = true, true, before
	r.Publish(&inst)
	return inst
}
