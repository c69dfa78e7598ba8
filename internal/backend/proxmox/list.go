package proxmox

import (
	"context"
	"sort"
	"strings"
	"time"

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
	names := map[string]bool{}
	for _, e := range res {
		names[e.Name] = true
	}
	for _, i := range out {
		names[i.Name] = true
	}
	out = append(out, d.listSeeds(ctx, names)...)
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

// listSeeds are the seed ISOs on the configured nodes' ISO storage whose
// VM (by name) stands nowhere in the cluster: what a deletion that was
// bypassed, or a VM removed by hand, left. A seed's name carries its
// proxy's name and the first 12 digits of its resource's UID, but no
// installation, and the file holds no more that the API would read back:
// it is listed with an empty mark and the UID prefix, for the sweep to
// report and never delete. A node that cannot be read is left for the
// next sweep: nothing is deleted on this listing.
func (d *Driver) listSeeds(ctx context.Context, vms map[string]bool) []proxy.Instance {
	var out []proxy.Instance
	for _, n := range d.cfg.Nodes {
		vols, err := d.api.ISOs(ctx, n, d.cfg.ISOStorage)
		if err != nil {
			d.logger(ctx).V(1).Info("proxmox list skips the seeds of a node whose ISO storage cannot be read", "node", n, "error", err.Error())
			continue
		}
		for _, v := range vols {
			name, prefix, ok := parseSeedFile(strings.TrimPrefix(v.VolID, d.cfg.ISOStorage+":iso/"))
			if !ok || vms[name] {
				continue
			}
			inst := proxy.Instance{ID: "nodes/" + n + "/" + v.VolID, Name: name, State: proxy.StateStopped,
				Placement: proxy.Placement{Location: n}, Leftovers: []string{"seed ISO " + v.VolID + " on node " + n},
				Details: map[string]string{proxy.DetailUIDPrefix: prefix}}
			if v.CTime > 0 {
				inst.CreatedAt = time.Unix(v.CTime, 0)
			}
			out = append(out, inst)
		}
	}
	return out
}
