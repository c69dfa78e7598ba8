package kubernetes

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// fenceCheckAfter is how old a Deployment must be before List calls its
// NetworkPolicy missing: its Create writes the NetworkPolicy just after
// it, and the list of NetworkPolicies may be read in between.
const fenceCheckAfter = time.Minute

// maxUnfencedLogged bounds the names one log line of noteUnfenced gives.
const maxUnfencedLogged = 10

// noteUnfenced marks, among deps (the config's Deployments, as List read
// them), the proxies that policies (the NetworkPolicies of the
// installation in their namespace, as List read them) hold none of their
// own for: deleted by hand, or never written by a Create the provider did
// not live to finish, which nothing else remembers. Get reads a marked
// proxy out of date and Update writes its children again, so it is
// fenced again within a poll. A proxy found with its NetworkPolicy is
// unmarked. It sends no request: List has read both lists already.
func (d *Driver) noteUnfenced(ctx context.Context, deps []appsv1.Deployment, policies []networkingv1.NetworkPolicy) {
	byName := make(map[string]*networkingv1.NetworkPolicy, len(policies))
	for i := range policies {
		byName[policies[i].Name] = &policies[i]
	}
	var found []string
	for i := range deps {
		dep := &deps[i]
		if dep.Labels[LabelUID] == "" || dep.DeletionTimestamp != nil {
			continue
		}
		key := client.ObjectKeyFromObject(dep)
		// Another resource's of the name, or one being deleted, fences
		// nothing of this proxy: Update names the first.
		if p := byName[dep.Name]; p != nil && p.DeletionTimestamp == nil && childOwned(p, dep, markOf(dep)) == nil {
			d.unfenced.drop(key)
			continue
		}
		if d.now().Sub(dep.CreationTimestamp.Time) < fenceCheckAfter {
			continue
		}
		d.unfenced.add(key)
		found = append(found, key.String())
	}
	if len(found) > 0 {
		d.logger(ctx).Info("proxies found without their NetworkPolicy; their next reconcile writes it again", "count", len(found), "proxies", found[:min(len(found), maxUnfencedLogged)])
	}
}
