package kvm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/digitalocean/go-libvirt"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Health reasons of the kvm backend, besides the shared ones.
const (
	ReasonReachable     = "Reachable"
	ReasonPoolNotFound  = "PoolNotFound"
	ReasonPoolNotActive = "PoolNotActive"
)

// Check implements proxy.Driver: per host, concurrently, on a fresh
// connection of its own (never the pooled one, so a check that runs out
// of time cannot disturb a reconcile): library version, hostname, and the
// storage pool's state and space.
func (d *Driver) Check(ctx context.Context) proxy.Health {
	out := make([]proxy.TargetHealth, len(d.cfg.Hosts))
	var wg sync.WaitGroup
	for i, h := range d.cfg.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = d.checkHost(ctx, h)
		}()
	}
	wg.Wait()
	if len(out) == 0 {
		out = []proxy.TargetHealth{{Target: "kvm", Reason: proxy.ReasonNotAvailable, Message: "the config has no hosts"}}
	}
	return proxy.Health{Targets: out}
}

func (d *Driver) checkHost(ctx context.Context, h Host) (th proxy.TargetHealth) {
	th = proxy.TargetHealth{Target: h.Name, Address: h.Address, Details: map[string]string{"user": h.User, "pool": h.pool()}}
	defer func() {
		d.log(ctx).V(1).Info("kvm host checked", "host", h.Name, "healthy", th.Healthy, "reason", th.Reason)
	}()
	fail := func(err error) proxy.TargetHealth {
		th.Reason = checkReason(ctx, err)
		th.Message = err.Error()
		return th
	}
	if ctx.Err() != nil {
		return fail(ctx.Err())
	}
	c, err := d.b.pool.fresh(ctx, d.target(h))
	if err != nil {
		return fail(err)
	}
	defer c.link.close("check finished")
	api := c.api
	v, err := api.ConnectGetLibVersion(ctx)
	if err != nil {
		return fail(err)
	}
	th.Details["libvirtVersion"] = fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000)
	hn, err := api.ConnectGetHostname(ctx)
	if err != nil {
		return fail(err)
	}
	if d.cfg.Guard == nil {
		// A tenant's host names itself in its own words: not shown.
		th.Details["hostname"] = hn
	}
	pool, err := api.StoragePoolLookupByName(ctx, h.pool())
	if err != nil {
		return fail(err)
	}
	info, err := api.StoragePoolGetInfo(ctx, pool)
	if err != nil {
		return fail(err)
	}
	th.Details["poolState"] = poolStateName(info.State)
	th.Details["poolCapacityGiB"] = strconv.FormatUint(info.Capacity>>30, 10)
	th.Details["poolAvailableGiB"] = strconv.FormatUint(info.Available>>30, 10)
	if mem, err := api.NodeGetMemoryStats(ctx); err == nil {
		th.Details["memoryTotalMiB"] = strconv.FormatUint(mem.Total>>20, 10)
		th.Details["memoryAvailableMiB"] = strconv.FormatUint(mem.Available()>>20, 10)
	}
	if info.State != libvirt.StoragePoolRunning {
		th.Reason = ReasonPoolNotActive
		th.Message = fmt.Sprintf("storage pool %s is %s, not running", pool.Name, poolStateName(info.State))
		return th
	}
	th.Healthy = true
	return th
}

// checkReason picks the reason of a failed check: the round's ctx ending
// is Timeout whatever was running; otherwise by dial stage, then by
// libvirt code.
func checkReason(ctx context.Context, err error) string {
	if ctx.Err() != nil {
		return proxy.ReasonTimeout
	}
	var de *dialError
	if errors.As(err, &de) {
		switch {
		case de.stage == stageCredentials && (errors.Is(err, errCredentials) || proxy.IsTransient(err)):
			return proxy.ReasonCredentialsUnavailable
		case de.stage == stageCredentials:
			return proxy.ReasonCredentialsUnavailable
		case de.stage == stageSSH && isSSHAuth(err):
			return proxy.ReasonUnauthorized
		default:
			if c, ok := libvirtCode(err); ok && (c == libvirt.ErrAccessDenied || c == libvirt.ErrAuthFailed) {
				return proxy.ReasonForbidden
			}
			return proxy.ReasonUnreachable
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return proxy.ReasonTimeout
	}
	if c, ok := libvirtCode(err); ok {
		switch c {
		case libvirt.ErrAccessDenied, libvirt.ErrAuthFailed:
			return proxy.ReasonForbidden
		case libvirt.ErrNoStoragePool:
			return ReasonPoolNotFound
		}
		return proxy.ReasonAPIError
	}
	return proxy.ReasonUnreachable
}

var poolStateNames = map[libvirt.StoragePoolState]string{
	libvirt.StoragePoolInactive:     "inactive",
	libvirt.StoragePoolBuilding:     "building",
	libvirt.StoragePoolRunning:      "running",
	libvirt.StoragePoolDegraded:     "degraded",
	libvirt.StoragePoolInaccessible: "inaccessible",
}

func poolStateName(s libvirt.StoragePoolState) string { return nameOf(poolStateNames, s) }

// nameOf is the name of libvirt's enum value v in names, "unknown" for one
// it does not list.
func nameOf[T comparable](names map[T]string, v T) string {
	if n, ok := names[v]; ok {
		return n
	}
	return "unknown"
}
