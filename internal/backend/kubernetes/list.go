package kubernetes

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// List implements proxy.Driver: the Deployments in the config's namespace
// carrying installationID's mark, and what of a proxy stands there
// without its Deployment (listLeftovers). From the same lists it marks
// the proxies without their Secret or NetworkPolicy (noteAbsent): List
// is the orphan sweep's, which runs for every config at the provider's
// start and then at its interval.
func (d *Driver) List(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	return proxy.RunList(ctx, installationID, d.wrap, d.list)
}

func (d *Driver) list(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	if !labelValue.MatchString(installationID) {
		return nil, proxy.Permanentf("installation ID %q is not a valid label value", installationID)
	}
	l := &appsv1.DeploymentList{}
	if err := d.client.List(ctx, l, client.InNamespace(d.cfg.Namespace),
		client.MatchingLabels{LabelManagedBy: ManagedBy, LabelInstallation: installationID}); err != nil {
		return nil, fmt.Errorf("cannot list Deployments in %s: %w", d.cfg.Namespace, err)
	}
	out := make([]proxy.Instance, 0, len(l.Items))
	deps := map[string]bool{}
	for i := range l.Items {
		deps[l.Items[i].Name] = true
		if l.Items[i].Labels[LabelUID] == "" {
			continue
		}
		out = append(out, listed(&l.Items[i]))
	}
	if lg := d.logger(ctx).V(telemetry.VDetail); lg.Enabled() {
		ids := make([]string, len(out))
		for i, inst := range out {
			ids[i] = inst.ID
		}
		lg.Info("kubernetes Deployments listed: names", "ids", ids)
	}
	left, children, err := d.listLeftovers(ctx, installationID, deps)
	if err != nil {
		return nil, err
	}
	if !d.cfg.NetworkPolicy {
		delete(children, "NetworkPolicy")
	}
	d.noteAbsent(ctx, d.cfg.Namespace, l.Items, children)
	return append(out, left...), nil
}
