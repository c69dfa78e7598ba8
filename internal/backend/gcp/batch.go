package gcp

import (
	"context"
	"fmt"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/batch"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// A steady instance (Running, its proxy answering, no operation to follow,
// nothing done to it by this process since) is observed from a snapshot
// of the project's aggregated instance list filtered on the installation
// label, shared by every steady proxy of the config
// (internal/backend/batch): polling N steady proxies costs about
// poll/MaxAge listings a poll instead of N instances.get. An instance the
// snapshot does not show, or shows changed (not Running, its spec label
// changed, its proxy not answering), and anything changing (created,
// updated, deleted, imported) is read directly.

// observeBatch is what the drivers of one pooled connection share for
// batched observation.
type observeBatch struct {
	snaps *batch.Snapshots[instanceIndex]

	steady batch.Map[string, string] // instance key -> spec label at its last steady Get
}

func newObserveBatch(maxAge time.Duration) *observeBatch {
	return &observeBatch{snaps: batch.New[instanceIndex](maxAge, nil)}
}

// instanceIndex is one aggregated listing: instances by zone/name, and
// the zones it could not reach.
type instanceIndex struct {
	byKey       map[string]*computeapi.Instance
	unreachable map[string]bool // zones/<zone>
}

// listInstallation reads every page of the aggregated listing of the
// installation's instances.
func (d *Driver) listInstallation(ctx context.Context, installationID string) (instanceIndex, error) {
	idx := instanceIndex{byKey: map[string]*computeapi.Instance{}, unreachable: map[string]bool{}}
	filter := fmt.Sprintf("labels.%s = %q", LabelInstallation, installationID)
	token := ""
	for {
		page, err := d.api.AggregatedInstances(ctx, filter, 500, token)
		if err != nil {
			return instanceIndex{}, err
		}
		for _, u := range page.GetUnreachables() {
			idx.unreachable[u] = true
		}
		for _, scoped := range page.GetItems() {
			for _, inst := range scoped.GetInstances() {
				idx.byKey[lastSegment(inst.GetZone())+"/"+inst.GetName()] = inst
			}
		}
		if token = page.GetNextPageToken(); token == "" {
			return idx, nil
		}
	}
}

// getSteady answers Get from the config's snapshot when ref's instance is
// steady; handled is false when Get must read directly.
func (d *Driver) getSteady(ctx context.Context, zone, name string, ref proxy.Ref) (proxy.Instance, bool, error) {
	key := zone + "/" + name
	if ref.ID == "" || ref.Live || ref.Deleting || ref.Operation != "" || !labelRE.MatchString(ref.Mark.InstallationID) {
		return proxy.Instance{}, false, nil
	}
	spec, ok := d.o.batch.steady.Get(key)
	if !ok || len(d.o.pending.toFollow(opsKey(zone, name), nil)) > 0 {
		return proxy.Instance{}, false, nil
	}
	if _, deleting := d.o.pending.ops.Get(deleteKey(zone, name)); deleting {
		return proxy.Instance{}, false, nil
	}
	idx, _, _, err := d.o.batch.snaps.Get(ctx, d.o.Provider+"\x00"+ref.Mark.InstallationID, key, func(ctx context.Context) (instanceIndex, error) {
		return d.listInstallation(ctx, ref.Mark.InstallationID)
	})
	if err != nil {
		return proxy.Instance{}, true, err
	}
	inst, ok := idx.byKey[key]
	if !ok || idx.unreachable["zones/"+zone] {
		d.o.batch.steady.Delete(key)
		return proxy.Instance{}, false, nil
	}
	v := d.view(ctx, inst, true, ref.ProxyCA)
	if v.State != proxy.StateRunning || !v.ProxyReachable || v.SpecHash != spec || v.Mark != ref.Mark {
		d.o.batch.steady.Delete(key)
		return proxy.Instance{}, false, nil
	}
	return v, true, nil
}

// noteDirect records a direct read of an instance: the next snapshot that
// answers it must be newer, and it is steady when it was Running with its
// proxy answering.
func (d *Driver) noteDirect(zone, name string, ref proxy.Ref, v proxy.Instance, inflight int) {
	key := zone + "/" + name
	d.o.batch.snaps.Observed(key)
	if ref.Live || ref.Deleting || inflight > 0 || v.State != proxy.StateRunning || !v.ProxyReachable || v.SpecHash == "" {
		d.o.batch.steady.Delete(key)
		return
	}
	d.o.batch.steady.Set(key, v.SpecHash)
}
