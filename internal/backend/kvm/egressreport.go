package kvm

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// The egress check from inside the guest (docs/allow-listing.md), for a
// proxy the provider cannot reach (a host firewall, a network without a
// route from the provider): the guest checks through its own Squid
// (cloudinit.EgressReport) and keeps the line in cloudinit.ReportPath,
// which Get reads through the guest agent (qemu-agent-command
// guest-file-open/read/close over libvirt) when its probe finds no Squid.

// agentRead reads at most max bytes of the guest's file path through the
// guest agent.
func agentRead(ctx context.Context, api Libvirt, dom libvirt.Domain, path string, max int) ([]byte, error) {
	out, err := api.QEMUDomainAgentCommand(ctx, dom, agentCommand("guest-file-open", map[string]string{"path": path, "mode": "r"}))
	if err != nil {
		return nil, agentErr(err)
	}
	var h agentReturn[int64]
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		return nil, proxy.Transientf("guest agent: guest-file-open answered something unexpected")
	}
	defer func() {
		_, _ = api.QEMUDomainAgentCommand(ctx, dom, agentCommand("guest-file-close", map[string]any{"handle": h.Return}))
	}()
	out, err = api.QEMUDomainAgentCommand(ctx, dom, agentCommand("guest-file-read", map[string]any{"handle": h.Return, "count": max}))
	if err != nil {
		return nil, agentErr(err)
	}
	var r agentReturn[struct {
		Buf string `json:"buf-b64"`
	}]
	if len(out) > 2*max || json.Unmarshal([]byte(out), &r) != nil {
		return nil, proxy.Transientf("guest agent: guest-file-read answered something unexpected")
	}
	b, err := base64.StdEncoding.DecodeString(r.Return.Buf)
	if err != nil || len(b) > max {
		return nil, proxy.Transientf("guest agent: guest-file-read answered something unexpected")
	}
	return b, nil
}

// readReport fills inst from the guest's report of its own egress check:
// a valid line from this instance's life that Squid answered inside the
// guest (an HTTP status, whether the check succeeded or not) makes the
// proxy count as reachable, and carries the address (Reported) or why
// the check failed. Anything else (no agent, no report yet, a malformed
// line, Squid not answering) leaves inst as it is. The guest's word is
// read strictly and never quoted.
func (d *Driver) readReport(ctx context.Context, api Libvirt, dom libvirt.Domain, inst *proxy.Instance) {
	b, err := agentRead(ctx, api, dom, cloudinit.ReportPath, squid.MaxReport)
	if err != nil {
		return
	}
	r, ok, err := squid.GuestReport(b, inst.CreatedAt, time.Now())
	if err != nil {
		d.log(ctx).V(1).Info("the guest's egress check report is not valid", "name", dom.Name, "error", err.Error())
	}
	if !ok {
		return
	}
	inst.ProxyReachable, inst.ReachableOnReport, inst.Progress = true, true, ""
	r.Publish(inst)
}
