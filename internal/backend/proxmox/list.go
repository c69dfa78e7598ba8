package proxmox

import (
	"context"
	"sort"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// List implements proxy.Driver.
func (d *Driver) List(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	d.warn(ctx)
	return proxy.RunList(ctx, installationID, d.wrap, d.list)
}

// list returns the VMs marked with installationID: those whose tags say so
// (one /cluster/resources request), those just cloned whose mark is only in
// their description yet (a config read for each untagged VM in the VMID
// range), and the clones this process has in flight. Creation times come
// from the facts cache, or a config read once per VM and process.
func (d *Driver) list(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	res, err := d.api.Resources(ctx, "vm")
	if err != nil {
		return nil, err
	}
	d.shared.forgetClones(d.cfg.URL, res)
	out := []proxy.Instance{}
	for _, e := range indexVMs(res).list {
		if e.Template {
			continue
		}
		if e.Name == "" {
			if c, ok := d.shared.clone(d.cfg.URL, e.VMID); ok && c.mark.InstallationID == installationID {
				out = append(out, proxy.Instance{ID: formatID(e.VMID, c.name), Name: c.name, Mark: c.mark, CreatedAt: c.createdAt,
					State: proxy.StateProvisioning, Placement: proxy.Placement{Location: e.Node}})
			}
			continue
		}
		t := parseTags(e.Tags)
		inRange := e.VMID >= d.cfg.VMIDMin && e.VMID <= d.cfg.VMIDMax
		if t.managed && t.mark.InstallationID != installationID || !t.managed && !inRange {
			continue
		}
		key := factKey{url: d.cfg.URL, vmid: e.VMID, uid: t.mark.UID, spec: t.spec}
		fc, cached := d.shared.fact(key)
		mark := t.mark
		if !t.managed || !cached {
			cfg, err := d.api.VMConfig(ctx, e.Node, e.VMID)
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				// One unreadable VM (gone meanwhile, its node busy) does not
				// hide the others.
				d.logger(ctx).V(1).Info("proxmox list skips a VM whose config cannot be read", "vmid", e.VMID, "error", err.Error())
				continue
			}
			desc := parseDescription(cfg["description"])
			if !t.managed {
				mark = desc.mark
			}
			fc = facts{createdAt: desc.createdAt, port: desc.port}
			if fc.createdAt.IsZero() {
				fc.createdAt = metaCTime(cfg["meta"])
			}
			if t.managed {
				d.shared.setFact(key, fc)
			}
		}
		if mark.UID == "" || mark.InstallationID != installationID {
			continue
		}
		inst := proxy.Instance{ID: formatID(e.VMID, e.Name), Name: e.Name, Mark: mark, CreatedAt: fc.createdAt,
			Placement: proxy.Placement{Location: e.Node}, SpecHash: t.spec}
		if e.Status == "stopped" {
			inst.State = proxy.StateStopped
		}
		out = append(out, inst)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if l := d.logger(ctx).V(telemetry.VDetail); l.Enabled() {
		ids := make([]string, len(out))
		for i, inst := range out {
			ids[i] = inst.ID
		}
		l.Info("proxmox vms listed: names", "ids", ids)
	}
	return out, nil
}
