package proxytest

import (
	"context"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Reconcile runs one reconcile of the resource asking for req, as
// crossplane-runtime's managed reconciler does, for a backend's own
// lifecycle and fault tests: Get ref; when NotFound, Create (or, once
// deleted, nothing: it is gone); when found, Delete once deleted, Update
// when the instance reports a spec hash other than req's. status is what
// status.atProvider holds: what Get or a successful Create or Update
// returned, empty once NotFound, unchanged when Get failed. It reports
// whether the resource reached its goal: Running with a reachable proxy,
// or gone once deleted.
func Reconcile(ctx context.Context, d proxy.Driver, ref proxy.Ref, req proxy.Request, status *proxy.Instance, deleted bool) (bool, error) {
	inst, err := d.Get(ctx, ref)
	switch {
	case proxy.IsNotFound(err):
		*status = proxy.Instance{}
		if deleted {
			return true, nil
		}
		return false, keep(status)(d.Create(ctx, req))
	case err != nil:
		return false, err
	}
	*status = inst
	if deleted {
		return false, d.Delete(ctx, ref)
	}
	if inst.SpecHash != "" && inst.SpecHash != proxy.Hash(req) {
		return false, keep(status)(d.Update(ctx, ref, req))
	}
	return inst.State == proxy.StateRunning && inst.ProxyReachable, nil
}

// keep records a successful answer in status and returns its error.
func keep(status *proxy.Instance) func(proxy.Instance, error) error {
	return func(inst proxy.Instance, err error) error {
		if err == nil {
			*status = inst
		}
		return err
	}
}
