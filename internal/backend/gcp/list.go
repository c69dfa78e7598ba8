package gcp

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

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
				out = append(out, d.view(ctx, inst, false, ""))
			}
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	left, err := d.listLeftovers(ctx, installationID, out)
	if err != nil {
		return nil, err
	}
	out = append(out, left...)
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

// listLeftovers are the static addresses and firewall rules carrying
// installationID's mark whose instance (of that name) is not among
// instances: what a create cut short left, or a deletion that was
// bypassed. One entry per name and mark, in the address's region (a
// rule alone is global: any zone of the config does). An address to be
// retained (retainAddress) is meant to outlive its proxy and is not one.
func (d *Driver) listLeftovers(ctx context.Context, installationID string, instances []proxy.Instance) ([]proxy.Instance, error) {
	have := map[string]bool{}
	for _, i := range instances {
		have[i.Name] = true
	}
	byKey := map[string]*proxy.Instance{}
	var keys []string
	add := func(name, region string, m proxy.Mark, created string, piece string) {
		k := name + "/" + m.UID
		e, ok := byKey[k]
		if !ok {
			e = &proxy.Instance{Name: name, Mark: m, State: proxy.StateStopped, CreatedAt: parseTime(created)}
			byKey[k] = e
			keys = append(keys, k)
		}
		if region != "" && e.Placement.Location == "" {
			e.Placement.Location = d.zoneIn(region)
		}
		if t := parseTime(created); !t.IsZero() && (e.CreatedAt.IsZero() || t.Before(e.CreatedAt)) {
			e.CreatedAt = t
		}
		e.Leftovers = append(e.Leftovers, piece)
	}
	filter := fmt.Sprintf("labels.%s = %q", LabelInstallation, installationID)
	for token := ""; ; {
		page, err := d.api.AggregatedAddresses(ctx, filter, 500, token)
		if err != nil {
			return nil, err
		}
		if u := page.GetUnreachables(); len(u) > 0 {
			return nil, proxy.Transientf("the listing of addresses could not reach %s", strings.Join(u, ", "))
		}
		for _, scope := range slices.Sorted(maps.Keys(page.GetItems())) {
			for _, a := range page.GetItems()[scope].GetAddresses() {
				l, m := a.GetLabels(), markOf(a.GetLabels())
				if m.UID == "" || m.InstallationID != installationID || l[LabelRetain] == "true" || have[a.GetName()] {
					continue
				}
				region := a.GetRegion()[strings.LastIndex(a.GetRegion(), "/")+1:]
				add(a.GetName(), region, m, a.GetCreationTimestamp(), "static address "+region+"/"+a.GetName())
			}
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	for token := ""; ; {
		page, err := d.api.ListFirewalls(ctx, 500, token)
		if err != nil {
			return nil, err
		}
		for _, fw := range page.GetItems() {
			m, ok := firewallMark(fw)
			if !ok || m.UID == "" || m.InstallationID != installationID || have[fw.GetName()] {
				continue
			}
			add(fw.GetName(), "", m, fw.GetCreationTimestamp(), "firewall rule "+fw.GetName())
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	out := make([]proxy.Instance, 0, len(keys))
	for _, k := range keys {
		e := byKey[k]
		if e.Placement.Location == "" {
			e.Placement.Location = d.zoneIn("")
		}
		e.ID = ID(e.Placement.Location, e.Name)
		out = append(out, *e)
	}
	return out, nil
}

// zoneIn is a zone of region for an ID that only needs its region: one
// the config names, else the region's zone b; for no region, the
// config's first zone.
func (d *Driver) zoneIn(region string) string {
	for _, z := range d.cfg.Zones {
		if region == "" || regionOf(z) == region {
			return z
		}
	}
	if region == "" {
		return "us-central1-a"
	}
	return region + "-b"
}

// parseTime reads a creationTimestamp; zero when there is none.
func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}
