package gcp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"google.golang.org/api/googleapi"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Health reasons of the gcp backend, beside the shared ones.
const (
	// ReasonQuotaExceeded: the check itself was refused for quota or rate.
	ReasonQuotaExceeded = "QuotaExceeded"
)

// quotaMetrics are the regional quotas a proxy consumes.
var quotaMetrics = []string{"INSTANCES", "CPUS", "IN_USE_ADDRESSES", "STATIC_ADDRESSES"}

// Check implements proxy.Driver. One target, the project. The check is
// one aggregated-list page with maxResults=1 and the installation filter:
// it proves the credentials, the Compute Engine API being enabled and
// compute.instances.list in one request. Then, for the regions of the
// config's zones, regions.get reports quota headroom (used/limit of
// instances, CPUs and addresses) in Details; a region that cannot be read
// adds a detail and does not fail the check.
func (d *Driver) Check(ctx context.Context) proxy.Health {
	t := proxy.TargetHealth{
		Target:  "projects/" + d.cfg.Project,
		Address: d.o.Endpoint,
		Details: map[string]string{"project": d.cfg.Project, "network": d.cfg.Network},
	}
	_, err := d.api.AggregatedInstances(ctx, "", 1, "")
	if err != nil {
		t.Reason, t.Message = checkReason(ctx, err), d.wrap(err, proxy.OpCheck).Error()
		return proxy.Health{Targets: []proxy.TargetHealth{t}}
	}
	t.Healthy = true
	regions := map[string]bool{}
	for _, z := range d.cfg.Zones {
		regions[regionOf(z)] = true
	}
	for _, r := range slices.Sorted(maps.Keys(regions)) {
		reg, err := d.api.GetRegion(ctx, r)
		if err != nil {
			t.Details["quota."+r] = "unavailable: " + classify(d.quietly(err)).Error()
			continue
		}
		for _, q := range reg.GetQuotas() {
			if slices.Contains(quotaMetrics, q.GetMetric()) {
				t.Details[fmt.Sprintf("quota.%s.%s", r, q.GetMetric())] = fmt.Sprintf("%g/%g", q.GetUsage(), q.GetLimit())
			}
		}
	}
	return proxy.Health{Targets: []proxy.TargetHealth{t}}
}

// checkReason names why the check failed.
func checkReason(ctx context.Context, err error) string {
	var ge *googleapi.Error
	switch {
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return proxy.ReasonTimeout
	case impersonationRefused(err):
		return proxy.ReasonForbidden
	case credentialsRefused(err):
		return proxy.ReasonUnauthorized
	case !errors.As(err, &ge):
		if strings.Contains(err.Error(), "auth: ") || strings.Contains(err.Error(), "credentials") {
			return proxy.ReasonCredentialsUnavailable
		}
		return proxy.ReasonUnreachable
	case proxy.IsQuota(classify(err)):
		return ReasonQuotaExceeded
	case ge.Code == http.StatusUnauthorized:
		return proxy.ReasonUnauthorized
	case ge.Code == http.StatusForbidden:
		return proxy.ReasonForbidden
	}
	return proxy.ReasonAPIError
}
