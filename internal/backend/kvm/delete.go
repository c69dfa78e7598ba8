package kvm

import (
	"context"
	"errors"

	"github.com/digitalocean/go-libvirt"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// undefineFlags remove what a domain may carry besides its definition;
// UEFI domains keep NVRAM, and undefine refuses without its flag.
const undefineFlags = libvirt.DomainUndefineNvram | libvirt.DomainUndefineManagedSave |
	libvirt.DomainUndefineSnapshotsMetadata | libvirt.DomainUndefineCheckpointsMetadata

// Delete implements proxy.Driver: destroy, undefine, then the overlay and
// the seed, under the name's lock. When it returns nil nothing of the
// instance is left on the host (the shared base image stays).
func (d *Driver) Delete(ctx context.Context, ref proxy.Ref) error {
	return proxy.RunErr(ctx, proxy.OpDelete, d.wrap, func(ctx context.Context) error { return d.delete(ctx, ref) })
}

func (d *Driver) delete(ctx context.Context, ref proxy.Ref) error {
	h, name, err := d.resolve(ref)
	if gone := (errHostGone{}); errors.As(err, &gone) {
		// The provider cannot reach it; refusing would pin the finalizer.
		d.log(ctx).Info("kvm delete: the instance's host is no longer configured; leaving it", "id", ref.ID, "reason", gone.Error())
		return nil
	}
	if err != nil {
		return err
	}
	key := Target{Host: h}.endpoint() + "/" + name
	if pe := d.b.pendingFor(key); pe != nil {
		if m := pe.plan.req.Mark; m != ref.Mark {
			return proxy.Permanentf("instance %s on host %s is being created for another resource (UID %s, installation %q); refusing to delete it",
				name, h.Name, m.UID, m.InstallationID)
		}
		pe.cancel()
		d.b.removePending(pe)
	}
	unlock, err := d.b.names.lock(ctx, key)
	if err != nil {
		return err
	}
	defer unlock()
	api, dom, meta, err := d.lookupMeta(ctx, h, name)
	switch {
	case err == nil:
		switch m := meta.mark(); {
		case m == (proxy.Mark{}):
			return proxy.Permanentf("domain %s on host %s carries no ownership mark; refusing to delete it", name, h.Name)
		case m != ref.Mark:
			return proxy.Permanentf("domain %s on host %s belongs to another resource (UID %s, installation %q); refusing to delete it",
				name, h.Name, m.UID, m.InstallationID)
		}
		if err := api.DomainDestroy(ctx, dom); err != nil && !isCode(err, libvirt.ErrOperationInvalid, libvirt.ErrNoDomain) {
			return err
		}
		if err := api.DomainUndefineFlags(ctx, dom, undefineFlags); err != nil && !isCode(err, libvirt.ErrNoDomain) {
			return err
		}
	case !isCode(err, libvirt.ErrNoDomain):
		return err
	}
	// Volumes may be left without a domain by a crash mid-create: remove
	// them whether or not the domain was there, when they are the
	// instance's own (deleteOwnVolumes).
	pool, err := api.StoragePoolLookupByName(ctx, h.pool())
	if isCode(err, libvirt.ErrNoStoragePool) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := d.deleteOwnVolumes(ctx, api, pool, name, h.Name, ref.Mark); err != nil {
		return err
	}
	d.log(ctx).V(1).Info("kvm domain deleted", "host", h.Name, "name", name)
	return nil
}
