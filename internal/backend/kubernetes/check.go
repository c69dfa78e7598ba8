package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Health reasons of this backend, beside the proxy.Reason* ones.
const (
	// ReasonNamespaceMissing: the config's namespace does not exist.
	ReasonNamespaceMissing = "NamespaceMissing"
	// ReasonInvalidConfig: a value of the config's kubernetes block that
	// goes into every proxy's pod template would be refused by the API
	// server (resources, nodeSelector, tolerations, affinity,
	// imagePullSecrets): no proxy could be created or updated.
	ReasonInvalidConfig = "InvalidConfig"
)

// CheckTarget names the one target Check reports.
const CheckTarget = "apiserver"

// Check implements proxy.Driver: it checks the values of the config that
// go into every proxy's pod template (validate), then reads the config's
// namespace, lists at most one labelled pod there and reads the API
// server's version, all from the API server itself, never from a cache;
// then asks the API server
// whether the config's identity holds every other permission the driver
// uses (Permissions), so that a config that could not create a
// Deployment reads unhealthy, naming what is missing, before any proxy
// fails on it.
func (d *Driver) Check(ctx context.Context) proxy.Health {
	t := proxy.TargetHealth{Target: CheckTarget, Address: d.host, Details: map[string]string{"namespace": d.cfg.Namespace}}
	fail := func(reason string, err error) proxy.Health {
		t.Reason, t.Message = reason, err.Error()
		return proxy.Health{Targets: []proxy.TargetHealth{t}}
	}
	if err := ctx.Err(); err != nil {
		return fail(proxy.ReasonTimeout, err)
	}
	// The config's own values first: no request tells more.
	if err := d.cfg.validate(); err != nil {
		return fail(ReasonInvalidConfig, err)
	}
	if d.version != nil {
		v, err := d.version(ctx)
		if err != nil {
			return fail(checkReason(ctx, err), fmt.Errorf("cannot read the server version: %w", d.quietly(err)))
		}
		if d.quiet {
			// A tenant's server: its numbers, never its words.
			v = netguard.Version(v)
		}
		t.Details["serverVersion"] = v
	}
	// A refused read is reported below with everything else the identity
	// lacks, named.
	var refused error
	ns := &corev1.Namespace{}
	if err := d.live.Get(ctx, types.NamespacedName{Name: d.cfg.Namespace}, ns); err != nil {
		switch {
		case kerrors.IsNotFound(err):
			return fail(ReasonNamespaceMissing, fmt.Errorf("namespace %q does not exist: create it, or set spec.kubernetes.namespace to one that does", d.cfg.Namespace))
		case !kerrors.IsForbidden(err):
			return fail(checkReason(ctx, err), fmt.Errorf("cannot get namespace %q: %w", d.cfg.Namespace, d.quietly(err)))
		}
		refused = fmt.Errorf("cannot get namespace %q: %w", d.cfg.Namespace, d.quietly(err))
	}
	pods := &corev1.PodList{}
	if err := d.live.List(ctx, pods, client.InNamespace(d.cfg.Namespace), client.MatchingLabels{LabelManagedBy: ManagedBy}, client.Limit(1)); err != nil {
		if !kerrors.IsForbidden(err) {
			return fail(checkReason(ctx, err), fmt.Errorf("cannot list pods in %q: %w", d.cfg.Namespace, d.quietly(err)))
		}
		refused = fmt.Errorf("cannot list pods in %q: %w", d.cfg.Namespace, d.quietly(err))
	}
	missing, err := d.missingPermissions(ctx, append(Permissions(d.cfg.Namespace, d.cached()), d.reportPermissions()...))
	if err != nil {
		return fail(checkReason(ctx, err), err)
	}
	if len(missing) > 0 {
		return fail(proxy.ReasonForbidden, missingError(missing))
	}
	if refused != nil {
		return fail(proxy.ReasonForbidden, refused)
	}
	// What the driver does without, said where the operator looks; an
	// error reviewing them says nothing of the config's health.
	if opt, err := d.missingPermissions(ctx, OptionalPermissions(d.cfg.Namespace)); err == nil && len(opt) > 0 {
		s := make([]string, len(opt))
		for i, p := range opt {
			s[i] = p.String()
		}
		t.Details[DetailOptionalMissing] = strings.Join(s, "; ")
	}
	// What a proxy would be refused for, said before one is: while some of
	// the cluster's networks are unknown and the config names none in
	// their place, a proxy may open no destination range (deniedNetworks).
	if len(d.cfg.ClusterNetworks) == 0 {
		if _, unknown, err := d.clusterNetworks(ctx); err == nil && len(unknown) > 0 {
			why, grants := whyUnknown(unknown)
			way := "name the cluster's pod, Service and node networks in spec.kubernetes.clusterNetworks"
			if grants {
				way = "grant the reads (cluster/rbac/podproxy.yaml), or " + way
			}
			t.Details[DetailNetworksUnknown] = why + "; so PodProxies that set allowedDestinationCIDRs are refused: " + way
		}
	}
	t.Healthy = true
	return proxy.Health{Targets: []proxy.TargetHealth{t}}
}

// DetailOptionalMissing is the health detail that names the
// OptionalPermissions the identity lacks: a proxy's deletion then leaves
// its Secret and NetworkPolicy to the garbage collector, or the orphan
// sweep finds no proxy whose Secret or NetworkPolicy is missing.
const DetailOptionalMissing = "optionalPermissionsMissing"

// DetailNetworksUnknown is the health detail that says which of the
// cluster's own networks cannot be read, and what PodProxies are refused
// for it (deniedNetworks).
const DetailNetworksUnknown = "clusterNetworksUnknown"

// checkReason maps a failed check onto a health reason.
func checkReason(ctx context.Context, err error) string {
	var status kerrors.APIStatus
	switch {
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || kerrors.IsTimeout(err) || kerrors.IsServerTimeout(err):
		return proxy.ReasonTimeout
	case kerrors.IsUnauthorized(err):
		return proxy.ReasonUnauthorized
	case kerrors.IsForbidden(err):
		return proxy.ReasonForbidden
	case errors.As(err, &status):
		return proxy.ReasonAPIError
	}
	return proxy.ReasonUnreachable
}
