package gcp

import (
	"context"
	"fmt"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// dropFirewall deletes (or, with disableOnly, disables) the proxy's rule
// when it exists and is ours.
func (d *Driver) dropFirewall(ctx context.Context, name string, mark proxy.Mark, disableOnly bool) (*OpRef, error) {
	fw, err := d.api.GetFirewall(ctx, name)
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading firewall rule %q: %w", name, classify(err))
	}
	m, ok := firewallMark(fw)
	if !ok || (mark.UID != "" && !ownedBy(m, mark)) || (mark.UID == "" && !fw.GetDisabled()) {
		return nil, nil
	}
	var op *computeapi.Operation
	if disableOnly {
		if fw.GetDisabled() {
			return nil, nil
		}
		op, err = d.api.PatchFirewall(ctx, name, &computeapi.Firewall{Disabled: ptr(true)})
	} else {
		op, err = d.api.DeleteFirewall(ctx, name)
	}
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("removing firewall rule %q: %w", name, classify(err))
	}
	o := opRefOf(op)
	return &o, nil
}

// ownedBy reports whether an object marked m belongs to the resource
// marked want: the same UID and, when want names one, the same
// installation (two installations sharing a project never touch each
// other's objects, even for a UID they share).
func ownedBy(m, want proxy.Mark) bool {
	return m.UID == want.UID && (want.InstallationID == "" || m.InstallationID == want.InstallationID)
}

func deleteKey(zone, name string) string { return "delete/" + zone + "/" + name }

func opsKey(zone, name string) string { return "ops/" + zone + "/" + name }

// Delete implements proxy.Driver, one step per call: the instance (after
// marking the rule and the address, so Get keeps reporting the proxy),
// then the static address unless retained, then the firewall rule. Each
// step's operation is followed; a step that is running returns nil, and
// the controller, seeing the proxy still there, calls again.
func (d *Driver) Delete(ctx context.Context, ref proxy.Ref) error {
	return proxy.RunErr(ctx, proxy.OpDelete, d.wrap, func(ctx context.Context) error { return d.delete(ctx, ref) })
}

func (d *Driver) delete(ctx context.Context, ref proxy.Ref) error {
	zone, name, err := d.resolve(ref)
	if err != nil {
		return err
	}
	d.o.batch.steady.Delete(zone + "/" + name) // changing: read directly from now on
	key := deleteKey(zone, name)
	if wait, err := d.pendingStep(ctx, key); err != nil || wait {
		if err != nil {
			return err
		}
		return nil
	}
	inst, err := d.api.GetInstance(ctx, zone, name)
	switch {
	case err == nil:
		m := markOf(inst.GetLabels())
		switch {
		case m == (proxy.Mark{}):
			return proxy.Permanentf("instance %q carries no ownership mark; refusing to delete it", name)
		case ref.Mark.UID != "" && !ownedBy(m, ref.Mark):
			return proxy.Permanentf("instance %q is not this resource's (%s); refusing to delete it", name, describeMark(m))
		}
		if _, err := d.dropFirewall(ctx, name, m, true); err != nil {
			return err
		}
		if _, err := d.setAddressLabels(ctx, regionOf(zone), name, m, func(l map[string]string) {
			if l[LabelRetain] != "true" {
				l[LabelDeleting] = "true"
			}
		}); err != nil {
			return err
		}
		op, err := d.api.DeleteInstance(ctx, zone, name)
		switch {
		case isNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("deleting instance %q: %w", name, classify(err))
		}
		d.o.pending.ops.Set(key, opRefOf(op))
		d.log(ctx).Info("deleting instance", "id", ID(zone, name), "operation", opRefOf(op).String())
		return nil
	case !isNotFound(err):
		return err
	}

	// The instance is gone: the address, then the rule.
	a, err := d.api.GetAddress(ctx, regionOf(zone), name)
	switch {
	case err == nil:
		l := a.GetLabels()
		ours := l[LabelUID] != "" && ((ref.Mark.UID != "" && ownedBy(markOf(l), ref.Mark)) || (ref.Mark.UID == "" && l[LabelDeleting] == "true"))
		if ours && l[LabelRetain] != "true" {
			op, err := d.api.DeleteAddress(ctx, regionOf(zone), name)
			switch {
			case isNotFound(err):
			case err != nil:
				return fmt.Errorf("releasing address %q: %w", name, classify(err))
			default:
				d.o.pending.ops.Set(key, opRefOf(op))
				d.log(ctx).Info("releasing static address", "address", name, "operation", opRefOf(op).String())
				return nil
			}
		}
	case !isNotFound(err):
		return fmt.Errorf("reading address %q: %w", name, classify(err))
	}
	mark := ref.Mark
	op, err := d.dropFirewall(ctx, name, mark, false)
	if err != nil {
		return err
	}
	if op != nil {
		d.o.pending.ops.Set(key, *op)
		d.log(ctx).Info("deleting firewall rule", "firewall", name, "operation", op.String())
	}
	return nil
}

// pendingStep follows the delete step in flight for key: wait is true
// while it runs; a failure is returned (and forgotten, so the next call
// tries again).
func (d *Driver) pendingStep(ctx context.Context, key string) (wait bool, err error) {
	o, ok := d.o.pending.ops.Get(key)
	if !ok {
		return false, nil
	}
	op, err := d.api.GetOperation(ctx, o)
	switch {
	case isNotFound(err):
		d.o.pending.ops.Delete(key)
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading operation %s: %w", o, classify(err))
	case op.GetStatus() != computeapi.OperationDone:
		return true, nil
	}
	d.o.pending.ops.Delete(key)
	if oe := operationError(o.String(), op); oe != nil {
		return false, classifyOperation(oe)
	}
	return false, nil
}
