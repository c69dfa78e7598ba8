package kvm

import (
	"context"
	"sort"
	"strings"

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
			out = append(out, proxy.Instance{ID: formatID(h.Name, dom.Name), Name: dom.Name, Mark: m, CreatedAt: meta.createdAt(), SpecHash: meta.SpecHash,
				Placement: proxy.Placement{Location: h.Name}})
		}
		taken := map[string]bool{}
		for _, dom := range doms {
			taken[dom.Name] = true
		}
		for _, pe := range d.b.pendingOn(Target{Host: h}.endpoint()) {
			taken[pe.plan.req.Name] = true
			if pe.plan.req.Mark.InstallationID == installationID && !seen[pe.plan.req.Name] {
				out = append(out, pe.view())
			}
		}
		left, err := d.listLeftovers(ctx, api, h, taken, installationID)
		if err != nil {
			return nil, err
		}
		out = append(out, left...)
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

// listLeftovers are the seeds on h carrying installationID's mark
// (seedMarkLines) whose domain is not there (taken names every domain and
// every create in flight), with the overlay of the same name when it is
// one the driver made: what a create cut short, or a deletion that was
// bypassed, left. A volume without a marked seed (an overlay alone, a
// seed of an earlier version) cannot be told apart from another
// installation's and is not listed.
func (d *Driver) listLeftovers(ctx context.Context, api Libvirt, h Host, taken map[string]bool, installationID string) ([]proxy.Instance, error) {
	pool, err := api.StoragePoolLookupByName(ctx, h.pool())
	if isCode(err, libvirt.ErrNoStoragePool) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	vols, err := api.StoragePoolListAllVolumes(ctx, pool)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, v := range vols {
		names[v.Name] = true
	}
	var out []proxy.Instance
	for _, v := range vols {
		name, ok := strings.CutSuffix(v.Name, "-seed.iso")
		if !ok || taken[name] || strings.HasPrefix(name, basePrefix) {
			continue
		}
		si, err := readSeed(ctx, api, v)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			d.log(ctx).V(1).Info("kvm list: skipping a volume that cannot be read", "host", h.Name, "volume", v.Name, "error", err.Error())
			continue
		}
		if !si.seed || si.hostname != name || si.mark.UID == "" || si.mark.InstallationID != installationID {
			continue
		}
		pieces := []string{"seed " + v.Name}
		if names[overlayName(name)] {
			if ov, err := api.StorageVolLookupByName(ctx, pool, overlayName(name)); err == nil {
				if _, own, err := isOverlay(ctx, api, ov); err == nil && own {
					pieces = append([]string{"overlay " + ov.Name}, pieces...)
				}
			}
		}
		inst := proxy.Instance{ID: formatID(h.Name, name), Name: name, Mark: si.mark, State: proxy.StateStopped,
			Placement: proxy.Placement{Location: h.Name}, Leftovers: pieces}
		inst.CreatedAt = si.modified
		out = append(out, inst)
	}
	return out, nil
}
