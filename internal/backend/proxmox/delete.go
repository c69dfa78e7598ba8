package proxmox

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Delete implements proxy.Driver, one step per call: stop, delete the
// seed where it was uploaded, destroy with purge and unreferenced disks.
// It returns nil while the VM is on its way out; Get finds it until the
// destroy task removed its config.
func (d *Driver) Delete(ctx context.Context, ref proxy.Ref) error {
	d.warn(ctx)
	d.unsteady(ref)
	return proxy.RunErr(ctx, proxy.OpDelete, d.wrap, func(ctx context.Context) error { return d.delete(ctx, ref) })
}

// delete takes one step of the deletion per call, decided from the VM:
//
//	a task running on it      -> wait (nil)
//	seed on storage           -> delete it where it was uploaded
//	running                   -> stop (in the same call)
//	stopped, seed gone        -> destroy (purge, unreferenced disks)
//	gone                      -> delete any seed of the resource still on
//	                             a node (a VM destroyed by hand), nil
//
// The seed goes before the VM, so that once Get says NotFound nothing of
// the proxy is left. A VM that is not the resource's is left alone.
func (d *Driver) delete(ctx context.Context, ref proxy.Ref) error {
	if ref.ID != "" {
		if _, _, err := parseID(ref.ID); err != nil {
			return err
		}
	}
	res, err := d.api.Resources(ctx, "")
	if err != nil {
		return err
	}
	d.shared.forgetClones(d.cfg.URL, res)
	idx := indexVMs(res)
	f, ok, err := d.locate(idx, ref)
	if err != nil {
		return err
	}
	if !ok {
		return d.sweep(ctx, idx, ref)
	}
	e := f.res
	if e.Name == "" {
		if f.clone != nil && f.clone.mark != ref.Mark {
			return d.sweep(ctx, idx, ref)
		}
		return proxy.Transientf("VM %d is still being cloned (locked: clone); it is deleted once the clone ends", e.VMID)
	}
	if e.Status == "unknown" {
		return proxy.Transientf("node %s is not answering, so VM %d (%s) cannot be deleted now", e.Node, e.VMID, f.name)
	}
	switch e.Lock {
	case "":
	case "suspended":
		return proxy.Transientf("%s", hibernatedMessage(e, "Proxmox will not destroy it; the deletion continues by itself once it is resumed or its state discarded"))
	default:
		return proxy.Transientf("%s", d.lockedMessage(e, "deleted"))
	}
	cfg, err := d.api.VMConfig(ctx, e.Node, e.VMID)
	if isNotExist(err) {
		return d.sweep(ctx, idx, ref)
	}
	if err != nil {
		return err
	}
	t := parseTags(cfg["tags"])
	desc := parseDescription(cfg["description"])
	mark := desc.mark
	if t.managed {
		mark = t.mark
	}
	if ref.Mark.UID == "" || mark != ref.Mark {
		d.logger(ctx).V(1).Info("proxmox vm left alone: not this resource's", "name", f.name, "vmid", e.VMID, "mark", describeMark(mark))
		return d.sweep(ctx, idx, ref)
	}
	log := d.logger(ctx).WithValues("name", f.name, "vmid", e.VMID, "node", e.Node)
	tasks, err := d.api.Tasks(ctx, e.Node, e.VMID)
	if err != nil {
		return err
	}
	if r := firstRunning(tasks); r != nil {
		log.V(1).Info("proxmox vm deletion waits for a task", "task", r.Type, "upid", r.UPID)
		return nil
	}
	// The seed, where it was uploaded (its node matters on node-local
	// storage, also after the VM migrated). It goes in the same step as
	// the stop: a running guest does not need its seed, and each step of
	// a deletion costs the controller a requeue. Only the ISO this
	// resource's name and UID give: whoever may edit the VM's description
	// must not choose which ISO goes (sweepSeeds finds the seed without it).
	seedGone := true
	switch own := d.isoVolID(ref.Name, ref.Mark.UID); desc.seedVolID {
	case "":
	case own:
		vols, err := d.api.ISOs(ctx, desc.seedNode, d.cfg.ISOStorage)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(vols, func(v Volume) bool { return v.VolID == desc.seedVolID }) {
			seedGone = false
			upid, err := d.api.DeleteVolume(ctx, desc.seedNode, desc.seedVolID)
			if err != nil {
				return err
			}
			log.V(1).Info("proxmox seed deleting", "seedNode", desc.seedNode, "volume", desc.seedVolID, "upid", upid)
		}
	default:
		log.V(1).Info("proxmox seed record left alone: not this resource's seed", "volume", desc.seedVolID, "want", own)
	}
	if e.Status == "running" {
		if err := d.recentFailure(ctx, tasks, "qmstop", fmt.Sprintf("stopping VM %d", e.VMID)); err != nil {
			return err
		}
		upid, err := d.api.Stop(ctx, e.Node, e.VMID)
		if err != nil {
			return err
		}
		log.V(1).Info("proxmox vm stopping", "upid", upid)
		return nil
	}
	if !seedGone {
		// Destroyed only once the seed is seen gone: then nothing is left
		// when Get says NotFound.
		return nil
	}
	// Without a record (a crash between the upload and the config), the
	// seed may be on any node.
	if deleted, err := d.sweepSeeds(ctx, idx, ref, e.Node); err != nil || deleted {
		return err
	}
	if err := d.recentFailure(ctx, tasks, "qmdestroy", fmt.Sprintf("destroying VM %d", e.VMID)); err != nil {
		return err
	}
	upid, err := d.api.Destroy(ctx, e.Node, e.VMID)
	if err != nil {
		if isNotExist(err) {
			return nil
		}
		return err
	}
	log.V(1).Info("proxmox vm destroying", "upid", upid)
	return nil
}

// sweep is sweepSeeds for a VM that is gone (or not the resource's): its
// seed deletion is not waited for, since nothing else is left to do.
func (d *Driver) sweep(ctx context.Context, idx vmIndex, ref proxy.Ref) error {
	_, err := d.sweepSeeds(ctx, idx, ref, "")
	return err
}

// sweepSeeds deletes the resource's seed ISO from every node that holds
// it (seedsOf), and reports whether it found one.
func (d *Driver) sweepSeeds(ctx context.Context, idx vmIndex, ref proxy.Ref, node string) (bool, error) {
	nodes, err := d.seedsOf(ctx, idx, ref, node)
	if err != nil {
		return false, err
	}
	vol := d.isoVolID(ref.Name, ref.Mark.UID)
	for _, n := range nodes {
		upid, err := d.api.DeleteVolume(ctx, n, vol)
		if err != nil {
			return true, err
		}
		d.logger(ctx).V(1).Info("proxmox seed deleting", "node", n, "volume", vol, "upid", upid)
	}
	return len(nodes) > 0, nil
}

// seedsOf returns the configured nodes (and also, when set, node) whose
// ISO storage holds the resource's seed ISO. Its name carries the
// resource's UID, so it is found without a VM. Offline nodes are skipped:
// a proxy never created there must not wait for them.
func (d *Driver) seedsOf(ctx context.Context, idx vmIndex, ref proxy.Ref, node string) ([]string, error) {
	if ref.Mark.UID == "" || !nameRe.MatchString(ref.Name) {
		return nil, nil
	}
	vol := d.isoVolID(ref.Name, ref.Mark.UID)
	nodes := slices.Clone(d.cfg.Nodes)
	if node != "" && !slices.Contains(nodes, node) {
		nodes = append(nodes, node)
	}
	var out []string
	for _, n := range nodes {
		if st, known := idx.nodes[n]; known && st != "online" {
			d.logger(ctx).V(1).Info("proxmox seed sweep skips an offline node", "node", n, "volume", vol)
			continue
		}
		vols, err := d.api.ISOs(ctx, n, d.cfg.ISOStorage)
		if err != nil {
			if statusOf(err) == 500 {
				// The storage is not on this node.
				continue
			}
			return out, err
		}
		if slices.ContainsFunc(vols, func(v Volume) bool { return v.VolID == vol }) {
			out = append(out, n)
		}
	}
	return out, nil
}

// leftovers is what Get reports for a resource being deleted whose VM is
// gone (or never appeared): its seed ISO, while a node still holds it,
// as a Stopped instance; otherwise NotFound.
func (d *Driver) leftovers(ctx context.Context, idx vmIndex, ref proxy.Ref) (proxy.Instance, error) {
	nodes, err := d.seedsOf(ctx, idx, ref, "")
	if err != nil {
		return proxy.Instance{}, err
	}
	if len(nodes) == 0 {
		return proxy.Instance{}, proxy.NotFoundf("no VM named %q", ref.Name)
	}
	return proxy.Instance{ID: ref.ID, Name: ref.Name, Mark: ref.Mark, State: proxy.StateStopped, Placement: ref.Placement,
		Progress: fmt.Sprintf("no VM; seed ISO %s remains on node %s and is deleted with the resource", d.isoVolID(ref.Name, ref.Mark.UID), strings.Join(nodes, ", "))}, nil
}
