package proxmox

import (
	"context"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Update implements proxy.Driver: it continues an unfinished provisioning,
// and applies changed proxy settings to a finished one by uploading a new
// seed (with a new cloud-init instance ID) and rebooting the VM.
func (d *Driver) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	d.warn(ctx)
	d.unsteady(ref)
	return proxy.Run(ctx, proxy.OpUpdate, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.update(ctx, ref, req) })
}

func (d *Driver) update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	if err := d.checkRequest(req); err != nil {
		return proxy.Instance{}, err
	}
	if _, _, _, err := d.placement(req.Placement); err != nil {
		return proxy.Instance{}, err
	}
	if ref.ID != "" {
		if _, _, err := parseID(ref.ID); err != nil {
			return proxy.Instance{}, err
		}
	}
	listed := time.Now()
	res, err := d.api.Resources(ctx, "vm")
	if err != nil {
		return proxy.Instance{}, err
	}
	d.shared.forgetClones(d.cfg.URL, res)
	if ref.Mark.UID == "" {
		ref.Mark = req.Mark
	}
	f, ok, err := d.locate(indexVMs(res), ref)
	if err != nil {
		return proxy.Instance{}, err
	}
	if !ok {
		return proxy.Instance{}, proxy.NotFoundf("no VM named %q", ref.Name)
	}
	f.listed = listed
	return d.adopt(ctx, f, req)
}
