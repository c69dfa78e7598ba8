package proxmox

import (
	"context"
	"strconv"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/batch"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// A steady VM (Running, its proxy answering, provisioning complete, and
// nothing done to it by this process since) is observed from a snapshot
// of /cluster/resources shared by every steady VM of the config
// (internal/backend/batch), with the address its guest agent reported
// before: polling N steady VMs costs about poll/MaxAge list calls a poll,
// not 2N requests. The snapshot must show the VM still running, unlocked,
// with the same spec tag and an uptime that did not go back (no reboot
// since the agent was asked); otherwise, and for anything changing
// (created, updated, deleted, not Ready, imported), Get reads directly.
// The proxy's port is probed on every Get either way.

// uptimeSlack absorbs the rounding of uptimes to seconds and the time a
// list takes.
const uptimeSlack = 5 * time.Second

// steadyVM is what the last Get of a steady VM learnt that
// /cluster/resources does not say: its address.
type steadyVM struct {
	name, spec string
	ip         string
	// uptime is the VM's uptime in the list that served that Get, and
	// seen when that list was taken.
	uptime int64
	seen   time.Time
}

type vmKey struct {
	url  string
	vmid int
}

func (k vmKey) String() string { return k.url + "#" + strconv.Itoa(k.vmid) }

func (s *Shared) snapshots() *batch.Snapshots[vmIndex] {
	s.snapOnce.Do(func() { s.snaps = batch.New[vmIndex](s.ObserveMaxAge, nil) })
	return s.snaps
}

// unsteady forgets that ref's VM was steady: the caller is about to change
// it, so the next Get reads it directly.
func (d *Driver) unsteady(ref proxy.Ref) {
	if vmid, _, err := parseID(ref.ID); err == nil {
		d.shared.steady.Delete(vmKey{d.cfg.URL, vmid})
	}
}

// getSteady answers Get from the config's snapshot when ref's VM is
// steady; handled is false when Get must read directly.
func (d *Driver) getSteady(ctx context.Context, ref proxy.Ref) (inst proxy.Instance, handled bool, err error) {
	if ref.ID == "" || ref.Live || ref.Deleting {
		return proxy.Instance{}, false, nil
	}
	vmid, name, err := parseID(ref.ID)
	if err != nil {
		return proxy.Instance{}, false, nil
	}
	k := vmKey{d.cfg.URL, vmid}
	sv, ok := d.shared.steady.Get(k)
	if !ok || sv.name != name {
		return proxy.Instance{}, false, nil
	}
	idx, taken, _, err := d.shared.snapshots().Get(ctx, d.provider+"\x00"+d.cfg.URL, k.String(), func(ctx context.Context) (vmIndex, error) {
		res, err := d.api.Resources(ctx, "vm")
		if err != nil {
			return vmIndex{}, err
		}
		d.shared.forgetClones(d.cfg.URL, res)
		return indexVMs(res), nil
	})
	if err != nil {
		return proxy.Instance{}, true, err
	}
	e, ok := idx.byID[vmid]
	t := parseTags(e.Tags)
	rebooted := time.Duration(e.Uptime)*time.Second+uptimeSlack < time.Duration(sv.uptime)*time.Second+taken.Sub(sv.seen)
	if !ok || bool(e.Template) || e.Name != name || e.Lock != "" || e.Status != "running" || !t.managed || t.spec != sv.spec || rebooted {
		d.shared.steady.Delete(k)
		return proxy.Instance{}, false, nil
	}
	inst, err = d.describe(ctx, found{res: e, name: name, knownIP: sv.ip, proxyCA: ref.ProxyCA, listed: taken, tenantGuest: ref.TenantGuest}, ref.Placement, ref.Mark, ref.Operation, nil)
	if err != nil || inst.State != proxy.StateRunning || !inst.ProxyReachable {
		// No longer Ready: this Get reads the VM itself, which says why.
		d.shared.steady.Delete(k)
		return proxy.Instance{}, false, nil
	}
	d.noteSteady(k, e, inst, err, taken)
	return inst, true, nil
}

// noteSteady records what a Get reported: a steady VM's address, or that
// it is not steady.
func (d *Driver) noteSteady(k vmKey, e Resource, inst proxy.Instance, err error, taken time.Time) {
	if err != nil || inst.State != proxy.StateRunning || !inst.ProxyReachable || inst.SpecHash == pendingSpec || e.Name == "" {
		d.shared.steady.Delete(k)
		return
	}
	d.shared.steady.Set(k, steadyVM{name: e.Name, spec: inst.SpecHash, ip: inst.IP, uptime: e.Uptime, seen: taken})
}
