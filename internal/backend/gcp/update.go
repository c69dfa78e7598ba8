package gcp

import (
	"context"
	"fmt"
	"maps"
	"strconv"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Update implements proxy.Driver: the firewall rule (created, patched or,
// when no longer managed, removed), the static address's retain label, and
// the instance's labels and metadata in one instances.update. When the
// Squid files (the TLS certificate and key among them) changed the update
// restarts the VM, whose startup script
// installs them from metadata (cloud-init runs once) and removes those
// of a feature turned off; an Ephemeral instance whose request is
// unchanged since an earlier provider rendered it is not restarted (see
// proxy.RenderedEarlier) and installs them at its next boot.
func (d *Driver) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	return proxy.Run(ctx, proxy.OpUpdate, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.update(ctx, ref, req) })
}

func (d *Driver) update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	zone, name, err := d.resolve(ref)
	if err != nil {
		return proxy.Instance{}, err
	}
	d.o.batch.steady.Delete(zone + "/" + name) // changing: read directly from now on
	req.Name = name
	req.Placement.Location = zone
	s, err := d.resolveSpec(req)
	if err != nil {
		return proxy.Instance{}, err
	}
	inst, err := d.api.GetInstance(ctx, zone, name)
	if err != nil {
		return proxy.Instance{}, err
	}
	if m := markOf(inst.GetLabels()); m != req.Mark {
		return proxy.Instance{}, proxy.Permanentf("instance %q is not this resource's (%s); refusing to update it", name, describeMark(m))
	}
	var ops []OpRef
	if exposureOf(req).ManageFirewall {
		op, err := d.ensureFirewall(ctx, req, firewallTarget(inst, req))
		if err != nil {
			return proxy.Instance{}, err
		}
		ops = appendOp(ops, op)
	} else {
		op, err := d.dropFirewall(ctx, name, req.Mark, false)
		if err != nil {
			return proxy.Instance{}, err
		}
		ops = appendOp(ops, op)
	}
	if s.addressType == AddressStatic {
		op, err := d.setAddressLabels(ctx, s.region, name, req.Mark, func(l map[string]string) {
			l[LabelRetain] = strconv.FormatBool(exposureOf(req).RetainAddress)
		})
		if err != nil {
			return proxy.Instance{}, err
		}
		ops = appendOp(ops, op)
	}

	oldMD, want := metadataMap(inst.GetMetadata()), s.metadata()
	md := merged(oldMD, want)
	// cloud-init ran at first boot with the user-data it had and does not
	// run again; keeping it keeps the instance as created (cloudInit is
	// immutable anyway), unless it holds a credential now turned off.
	if ud, ok := oldMD[MetadataUserData]; ok && !holdsTurnedOff(ud, s) {
		md[MetadataUserData] = ud
	}
	guestFiles := []string{MetadataHtpasswd, MetadataTLSCert, MetadataTLSKey}
	for _, f := range cloudinit.EgressCheckFiles(&cloudinit.EgressReport{}) {
		guestFiles = append(guestFiles, egressCheckKey(f.Path))
	}
	for _, k := range append(guestFiles, MetadataGuestAttributes) {
		if _, on := want[k]; !on {
			// Turned off: the credential does not stay behind in metadata,
			// nor the guest's leave to report (Get reads its report while
			// that is on).
			delete(md, k)
		}
	}
	// The startup script installs the guest's files at boot.
	restart := oldMD[MetadataSquidConf] != s.squidConf
	for _, k := range guestFiles {
		restart = restart || oldMD[k] != want[k]
	}
	if restart && s.addressType == AddressEphemeral && proxy.RenderedEarlier(inst.GetLabels()[LabelSpec], req) {
		// Only the provider's rendering changed since the instance was
		// made (an upgrade): a restart would give up its ephemeral external
		// address, which clients and destinations may allow-list, so the
		// new files wait in metadata for the instance's next boot.
		restart = false
	}
	labels := s.labels()
	if restart || !maps.Equal(inst.GetLabels(), labels) || !maps.Equal(oldMD, md) {
		// A copy with its own labels and metadata; the rest is shared,
		// never changed.
		upd := *inst
		upd.Labels = labels
		upd.Metadata = &computeapi.Metadata{Fingerprint: inst.GetMetadata().Fingerprint, Items: metadataItems(md)}
		action := "NO_EFFECT"
		if restart {
			action = "RESTART"
		}
		op, err := d.api.UpdateInstance(ctx, zone, &upd, action)
		if err != nil {
			return proxy.Instance{}, fmt.Errorf("updating instance %q: %w", name, classify(err))
		}
		ops = append(ops, opRefOf(op))
		d.log(ctx).Info("updating instance", "id", ID(zone, name), "operation", opRefOf(op).String(), "restart", restart)
		inst = &upd
	}
	d.o.pending.remember(opsKey(zone, name), ops)
	v := d.view(ctx, inst, false, "")
	v.Operation = joinOps(ops)
	if len(ops) > 0 {
		v.Progress = "updating"
	}
	return v, nil
}

// holdsTurnedOff reports whether user-data ud installs a credential that s
// has turned off or replaced (the htpasswd, the TLS key, the egress
// check's request): a copy that no longer works is a copy too many.
func holdsTurnedOff(ud string, s *spec) bool {
	_, key := cloudinit.TLSOf(ud)
	check := ""
	if r := egressReport(s.req); r != nil {
		check = r.Request
	}
	stale := func(staged, now string) bool { return staged != "" && staged != now }
	return stale(cloudinit.HtpasswdOf(ud), s.htpasswd) || stale(key, s.tlsKey) || stale(cloudinit.EgressRequestOf(ud), check)
}

// merged is a copy of a with b's entries over it.
func merged(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, b)
	return out
}

// setAddressLabels changes an address's labels when it exists and is
// ours; a missing or foreign address is left alone.
func (d *Driver) setAddressLabels(ctx context.Context, region, name string, mark proxy.Mark, change func(map[string]string)) (*OpRef, error) {
	a, err := d.api.GetAddress(ctx, region, name)
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading address %q: %w", name, classify(err))
	}
	if m := markOf(a.GetLabels()); m.UID == "" || (mark.UID != "" && !ownedBy(m, mark)) {
		return nil, nil
	}
	labels := merged(a.GetLabels(), nil)
	change(labels)
	if maps.Equal(labels, a.GetLabels()) {
		return nil, nil
	}
	op, err := d.api.SetAddressLabels(ctx, region, name, a.GetLabelFingerprint(), labels)
	if err != nil {
		return nil, fmt.Errorf("labelling address %q: %w", name, classify(err))
	}
	o := opRefOf(op)
	return &o, nil
}
