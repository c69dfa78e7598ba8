package gcp

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// List implements proxy.Driver: the aggregated listing filtered on the
// installation label, every page. A zone that did not answer
// (unreachables) fails the whole list, Transient: a partial list would
// look like instances had vanished.
func (d *Driver) List(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	return proxy.RunList(ctx, installationID, d.wrap, d.list)
}

func (d *Driver) list(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	if !labelRE.MatchString(installationID) {
		return nil, proxy.Permanentf("invalid installation ID %q", installationID)
	}
	filter := fmt.Sprintf("labels.%s = %q", LabelInstallation, installationID)
	out := []proxy.Instance{}
	token := ""
	for {
		page, err := d.api.AggregatedInstances(ctx, filter, 500, token)
		if err != nil {
			return nil, err
		}
		if u := page.GetUnreachables(); len(u) > 0 {
			return nil, proxy.Transientf("the listing could not reach %s", strings.Join(u, ", "))
		}
		for _, scope := range slices.Sorted(maps.Keys(page.GetItems())) {
			for _, inst := range page.GetItems()[scope].GetInstances() {
				if markOf(inst.GetLabels()).InstallationID != installationID {
					continue // the filter should have; never trust it with GC
				}
				out = append(out, d.view(ctx, inst, false))
			}
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	slices.SortFunc(out, func(a, b proxy.Instance) int { return strings.Compare(a.ID, b.ID) })
	if l := d.log(ctx).V(telemetry.VDetail); l.Enabled() {
		ids := make([]string, len(out))
		for i, inst := range out {
			ids[i] = inst.ID
		}
		l.Info("gcp instances listed: names", "ids", ids)
	}
	return out, nil
}
