package kvm

import (
	"context"
	"slices"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

var _ proxy.Tidier = (*Driver)(nil)

// Tidy implements proxy.Tidier: on each host, the base images of the
// host's pool (egressproxy-base-*, with their .sha256 markers) that no
// volume of the pool is backed by, no domain uses as a disk, and no
// download or create of this process waits for, once found so for
// UnusedImageRetention (counted from the first Tidy that found it
// unused, in this process). A host that cannot be read is skipped: the
// images there wait for the next Tidy.
func (d *Driver) Tidy(ctx context.Context) ([]string, error) {
	return proxy.Run(ctx, "Tidy", d.wrap, d.tidy)
}

func (d *Driver) tidy(ctx context.Context) ([]string, error) {
	if d.cfg.UnusedImageRetention <= 0 {
		return nil, nil
	}
	var out []string
	for _, h := range d.cfg.Hosts {
		removed, err := d.tidyHost(ctx, h)
		if err != nil {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			d.log(ctx).Info("kvm tidy: cannot read the base images of a host; leaving them", "host", h.Name, "error", err.Error())
			continue
		}
		out = append(out, removed...)
	}
	return out, nil
}

func (d *Driver) tidyHost(ctx context.Context, h Host) ([]string, error) {
	api, err := d.conn(ctx, h)
	if err != nil {
		return nil, err
	}
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
	endpoint := Target{Host: h}.endpoint()
	var bases []libvirt.StorageVol
	used := map[string]bool{} // volume names and paths in use
	for _, p := range d.b.pendingOn(endpoint) {
		used[p.plan.image.volume()] = true
	}
	for _, v := range vols {
		if strings.HasPrefix(v.Name, basePrefix) {
			if !strings.HasSuffix(v.Name, ".sha256") {
				bases = append(bases, v)
			}
			continue
		}
		desc, _, err := isOverlay(ctx, api, v)
		if err != nil {
			if isCode(err, libvirt.ErrNoStorageVol) {
				continue
			}
			return nil, err
		}
		if p := desc.BackingStore.Path; p != "" {
			used[p] = true
		}
	}
	if len(bases) == 0 {
		return nil, nil
	}
	doms, err := api.ConnectListAllDomains(ctx, libvirt.ConnectListDomainsActive|libvirt.ConnectListDomainsInactive)
	if err != nil {
		return nil, err
	}
	for _, dom := range doms {
		x, err := api.DomainGetXMLDesc(ctx, dom)
		if isCode(err, libvirt.ErrNoDomain) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var def libvirtxml.Domain
		if err := def.Unmarshal(x); err != nil {
			// A definition that does not parse may use any image.
			return nil, nil
		}
		if def.Devices == nil {
			continue
		}
		for _, disk := range def.Devices.Disks {
			switch s := disk.Source; {
			case s == nil:
			case s.File != nil:
				used[s.File.File] = true
			case s.Block != nil:
				used[s.Block.Dev] = true
			case s.Volume != nil && s.Volume.Pool == pool.Name:
				used[s.Volume.Volume] = true
			}
		}
	}
	var out []string
	now := d.b.clock()
	for _, v := range bases {
		key := endpoint + "/" + pool.Name + "/" + v.Name
		path, err := api.StorageVolGetPath(ctx, v)
		if err != nil {
			if isCode(err, libvirt.ErrNoStorageVol) {
				continue
			}
			return out, err
		}
		if used[path] || used[v.Name] || d.b.images.running(key) {
			d.b.markUnused(key, false)
			continue
		}
		if since := d.b.markUnused(key, true); now.Sub(since) < d.cfg.UnusedImageRetention {
			continue
		}
		for _, name := range []string{v.Name, v.Name + ".sha256"} {
			vol, err := api.StorageVolLookupByName(ctx, pool, name)
			if isCode(err, libvirt.ErrNoStorageVol) {
				continue
			}
			if err == nil {
				err = api.StorageVolDelete(ctx, vol)
			}
			if err != nil && !isCode(err, libvirt.ErrNoStorageVol) {
				return out, err
			}
		}
		d.b.markUnused(key, false)
		d.log(ctx).Info("kvm evicted a base image no proxy used", "host", h.Name, "pool", pool.Name, "volume", v.Name, "unusedFor", d.cfg.UnusedImageRetention.String())
		out = append(out, "base image "+v.Name+" in pool "+pool.Name+" on host "+h.Name)
	}
	slices.Sort(out)
	return out, nil
}
