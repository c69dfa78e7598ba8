package kubernetes

import (
	"context"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Update implements proxy.Driver: every setting changes in place. A changed
// squid.conf or htpasswd changes the pod template's config hash, which
// rolls the pod (the new one first).
func (d *Driver) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	return proxy.Run(ctx, proxy.OpUpdate, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.update(ctx, ref, req) })
}

func (d *Driver) update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	// Before any request: the Deployment's write would be refused.
	if err := d.cfg.validate(); err != nil {
		return proxy.Instance{}, err
	}
	dep, err := d.deployment(ctx, ref)
	if err != nil {
		return proxy.Instance{}, err
	}
	if err := owned(dep, req.Mark, "update"); err != nil {
		return proxy.Instance{}, err
	}
	if dep.DeletionTimestamp != nil {
		return proxy.Instance{}, proxy.Transientf("Deployment %s/%s is being deleted", dep.Namespace, dep.Name)
	}
	req.Name = dep.Name // the objects are named after the Deployment
	nets, err := d.deniedNetworks(ctx, req)
	if err != nil {
		return proxy.Instance{}, err
	}
	files, err := squid.Render(req.Proxy, squidOptions(req, nets))
	if err != nil {
		return proxy.Instance{}, err
	}
	// Get reports a proxy with a missing child as out of date: Update
	// rewrites the children whatever the hashes say.
	return d.complete(ctx, dep, req, files, nets, true)
}
