package kvm

import (
	"context"
	"sort"

	"github.com/digitalocean/go-libvirt"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// List implements proxy.Driver: the domains on every host carrying the
// installation's mark, plus creates of this process still waiting for an
// image. One host that cannot be listed fails the whole list, so a
// collector never acts on a partial view.
func (d *Driver) List(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	return proxy.RunList(ctx, installationID, d.wrap, d.list)
}

func (d *Driver) list(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	out := []proxy.Instance{}
	for _, h := range d.cfg.Hosts {
		api, err := d.conn(ctx, h)
		if err != nil {
			return nil, err
		}
		doms, err := api.ConnectListAllDomains(ctx, libvirt.ConnectListDomainsActive|libvirt.ConnectListDomainsInactive)
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		for _, dom := range doms {
			meta, err := readMeta(ctx, api, dom)
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				// Mid-teardown or a corrupt element: not a reason to fail
				// every other domain.
				d.log(ctx).V(1).Info("kvm list: skipping a domain whose metadata cannot be read", "host", h.Name, "name", dom.Name, "error", err.Error())
				continue
			}
			m := meta.mark()
			if m == (proxy.Mark{}) || m.InstallationID != installationID {
				continue
			}
			seen[dom.Name] = true
			out = append(out, proxy.Instance{ID: formatID(h.Name, dom.Name), Name: dom.Name, Mark: m, CreatedAt: meta.createdAt(), SpecHash: meta.SpecHash})
		}
		for _, pe := range d.b.pendingOn(Target{Host: h}.endpoint()) {
			if pe.plan.req.Mark.InstallationID == installationID && !seen[pe.plan.req.Name] {
				out = append(out, pe.view())
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	d.log(ctx).V(1).Info("kvm domains listed", "count", len(out))
	if l := d.log(ctx).V(telemetry.VDetail); l.Enabled() {
		names := make([]string, len(out))
		for i, inst := range out {
			names[i] = inst.ID
		}
		l.Info("kvm domains listed: names", "ids", names)
	}
	return out, nil
}
