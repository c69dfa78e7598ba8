package gcp

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Get implements proxy.Driver. It reads the operations in ref.Operation
// first (one request each, only while some are in flight or failed), then
// the instance (one request). A failed operation is reported, with GCP's
// code, for FailedOperationHold after it ended; then it is dropped, Get
// says NotFound, and the controller creates again.
func (d *Driver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	return proxy.Run(ctx, proxy.OpGet, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.get(ctx, ref) })
}

func (d *Driver) get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	zone, name, err := d.resolve(ref)
	if err != nil {
		return proxy.Instance{}, err
	}
	if v, handled, err := d.getSteady(ctx, zone, name, ref); handled {
		return v, err
	}
	key := opsKey(zone, name)
	inflight, progress, err := d.follow(ctx, d.o.pending.toFollow(key, splitOps(ref.Operation)))
	if err != nil {
		return proxy.Instance{}, err
	}
	d.o.pending.followedUpTo(key, inflight)
	inst, err := d.api.GetInstance(ctx, zone, name)
	switch {
	case err == nil:
		v := d.view(ctx, inst, true, ref.ProxyCA)
		v.Operation = joinOps(inflight)
		if v.Progress == "" {
			v.Progress = progress
		}
		d.noteDirect(zone, name, ref, v, len(inflight))
		return v, nil
	case !isNotFound(err):
		return proxy.Instance{}, err
	}
	if len(inflight) > 0 {
		// Accepted and not done: never NotFound, or the controller would
		// create a second time.
		return proxy.Instance{
			ID: ID(zone, name), Name: name, Mark: ref.Mark, State: proxy.StateProvisioning,
			Placement: ref.Placement, Progress: progress, Operation: joinOps(inflight),
		}, nil
	}
	if ref.ID != "" || ref.Deleting {
		left, mark, err := d.leftovers(ctx, zone, name, ref.Mark, ref.Deleting)
		if err != nil {
			return proxy.Instance{}, err
		}
		if left != "" {
			return proxy.Instance{ID: ID(zone, name), Name: name, Mark: mark, State: proxy.StateStopped, Placement: ref.Placement, Progress: left}, nil
		}
	}
	return proxy.Instance{}, proxy.NotFoundf("instance %q not found in zone %s", name, zone)
}

// follow reads operations: it returns those still running and a progress
// line, and the error of one that failed within the hold.
func (d *Driver) follow(ctx context.Context, ops []OpRef) ([]OpRef, string, error) {
	var inflight []OpRef
	var progress []string
	for _, o := range ops {
		op, err := d.api.GetOperation(ctx, o)
		if isNotFound(err) {
			continue // operations are garbage-collected after a while
		}
		if err != nil {
			return nil, "", fmt.Errorf("reading operation %s: %w", o, classify(err))
		}
		if op.GetStatus() != computeapi.OperationDone {
			inflight = append(inflight, o)
			progress = append(progress, fmt.Sprintf("%s %s: %s %d%%", op.GetOperationType(), lastSegment(op.GetTargetLink()), op.GetStatus(), op.GetProgress()))
			continue
		}
		oe := operationError(o.String(), op)
		if oe == nil || oe.alreadyExists() {
			continue
		}
		ferr := classifyOperation(oe)
		hold := d.o.FailedOperationHold
		if proxy.IsPermanent(ferr) {
			hold *= 10
		}
		if oe.Ended.IsZero() || d.o.Now().Sub(oe.Ended) < hold {
			return nil, "", ferr
		}
		d.log(ctx).V(1).Info("dropping a failed operation past its hold", "operation", o.String(), "error", oe.Error())
	}
	return inflight, strings.Join(progress, "; "), nil
}

// leftovers says what of a deleted instance is still being removed: a
// disabled rule of ours, or a static address labelled LabelDeleting; ""
// when nothing is. For a resource being deleted (deleting) it is also a
// rule or an unretained address carrying the resource's mark that a
// Create cut short left before its instance appeared. It is read only
// when the instance is gone and the resource had one or is being
// deleted, so steady state never pays for it.
func (d *Driver) leftovers(ctx context.Context, zone, name string, mark proxy.Mark, deleting bool) (string, proxy.Mark, error) {
	deleting = deleting && mark.UID != ""
	// What a leftover is reported with is the mark it carries: one made
	// under another installation ID for this resource (its UID) is still
	// its own to delete, under that mark.
	own := func(m proxy.Mark) proxy.Mark {
		if m.UID == "" {
			return mark
		}
		return m
	}
	fw, err := d.api.GetFirewall(ctx, name)
	switch {
	case err == nil:
		m, ok := firewallMark(fw)
		if ok && fw.GetDisabled() && (mark.UID == "" || m.UID == mark.UID) {
			return "deleting: firewall rule " + name + " remains", own(m), nil
		}
		if ok && deleting && m.UID == mark.UID {
			return "deleting: firewall rule " + name + ", made before the instance, remains", own(m), nil
		}
	case !isNotFound(err):
		return "", proxy.Mark{}, fmt.Errorf("reading firewall rule %q: %w", name, classify(err))
	}
	a, err := d.api.GetAddress(ctx, regionOf(zone), name)
	switch {
	case err == nil:
		l := a.GetLabels()
		if l[LabelDeleting] == "true" && (mark.UID == "" || l[LabelUID] == mark.UID) {
			return "deleting: releasing static address " + name, own(markOf(l)), nil
		}
		if deleting && l[LabelUID] != "" && l[LabelUID] == mark.UID && l[LabelRetain] != "true" {
			return "deleting: static address " + name + ", reserved before the instance, remains", own(markOf(l)), nil
		}
	case !isNotFound(err):
		return "", proxy.Mark{}, fmt.Errorf("reading address %q: %w", name, classify(err))
	}
	return "", proxy.Mark{}, nil
}

// view maps an instance onto proxy.Instance; probe checks the proxy port
// when the instance is running with an address (with TLS, verified
// against ca, when ca is set).
func (d *Driver) view(ctx context.Context, inst *computeapi.Instance, probe bool, ca string) proxy.Instance {
	zone := lastSegment(inst.GetZone())
	labels := inst.GetLabels()
	v := proxy.Instance{
		ID:       ID(zone, inst.GetName()),
		Name:     inst.GetName(),
		Mark:     markOf(labels),
		SpecHash: labels[LabelSpec],
		Placement: proxy.Placement{
			Location: zone, MachineType: labels[LabelMachineType], Image: labels[LabelImage],
		},
		Details: map[string]string{},
	}
	if t, err := time.Parse(time.RFC3339Nano, inst.GetCreationTimestamp()); err == nil {
		v.CreatedAt = t.UTC()
	}
	if t, err := time.Parse(time.RFC3339Nano, inst.GetLastStartTimestamp()); err == nil {
		v.StartedAt = t.UTC()
	}
	var natIP, internalIP string
	if nics := inst.GetNetworkInterfaces(); len(nics) > 0 {
		internalIP = nics[0].GetNetworkIP()
		for _, ac := range nics[0].GetAccessConfigs() {
			if ac.GetNatIP() != "" {
				natIP = ac.GetNatIP()
				break
			}
		}
	}
	v.IP, v.EgressIP, v.BackendEgressIP = natIP, natIP, natIP
	if natIP != "" {
		v.EgressSource = proxy.EgressBackend
	}
	if labels[LabelAddress] == "internal" {
		// Clients reach the internal address; traffic leaves through
		// whatever the network routes (Cloud NAT), unknown here.
		v.IP, v.EgressIP, v.EgressSource, v.BackendEgressIP = internalIP, "", "", ""
	}
	if internalIP != "" {
		v.Details["networkIP"] = internalIP
	}
	d.log(ctx).V(telemetry.VDetail).Info("gcp addresses found", "id", v.ID, "natIP", natIP, "networkIP", internalIP, "addressType", labels[LabelAddress], "ip", v.IP)
	if a := labels[LabelAddress]; a != "" {
		v.Details["addressType"] = a
	}
	v.Details["status"] = inst.GetStatus()
	v.State = mapState(inst.GetStatus(), v.IP)
	if _, deleting := d.o.pending.ops.Get(deleteKey(zone, inst.GetName())); deleting {
		v.Progress = "deleting"
		if v.State == proxy.StateRunning {
			v.State = proxy.StateStopped
		}
	}
	if probe && v.State == proxy.StateRunning && v.Progress == "" {
		port := labels[LabelPort]
		if _, err := strconv.Atoi(port); err == nil {
			addr := net.JoinHostPort(v.IP, port)
			// The prober is every config's: an ID names no project.
			pr := d.o.Prober.Check(ctx, d.o.guard.Reported(), d.o.Provider+"/"+v.ID, addr, squid.Expected(v.Mark), ca)
			v.ProxyReachable = pr.Serving
			if pr.Serving {
				v.ProxyAddress = addr
				squid.NoteAnswer(&v, pr)
			}
			switch {
			case pr.Refused:
				v.Progress = pr.Message
			case !pr.Serving && !pr.Pending:
				v.Progress = "waiting for Squid to answer: " + pr.Message
				if reportsCheck(metadataMap(inst.GetMetadata())) {
					// Unreached (a firewall admitting only the
					// clients): the guest's own check stands for it.
					d.readReport(ctx, zone, inst.GetName(), &v, inst.GetLastStartTimestamp())
				}
			}
		}
	}
	return v
}

// mapState maps an instance status; RUNNING needs an address.
//
//	PROVISIONING, STAGING, REPAIRING           Provisioning
//	RUNNING without an address                 Provisioning
//	RUNNING with one                           Running
//	STOPPING, STOPPED, SUSPENDING, SUSPENDED,
//	TERMINATED, anything else                  Stopped
//
// TERMINATED is Compute Engine's word for a stopped VM (it can be started
// again), so it is Stopped, not Terminated.
func mapState(status, ip string) proxy.State {
	switch status {
	case "PROVISIONING", "STAGING", "REPAIRING":
		return proxy.StateProvisioning
	case "RUNNING":
		if ip == "" {
			return proxy.StateProvisioning
		}
		return proxy.StateRunning
	}
	return proxy.StateStopped
}
