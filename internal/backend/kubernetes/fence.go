package kubernetes

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// childCheckAfter is how old a Deployment must be before List calls one
// of its children missing: its Create writes them just after it, and the
// lists may be read in between.
const childCheckAfter = time.Minute

// maxAbsentLogged bounds the names one log line of noteAbsent gives.
const maxAbsentLogged = 10

// childOrder is the order children writes the children List looks for,
// in which a progress names them.
var childOrder = []string{"Secret", "NetworkPolicy", "Service"}

// absent are, per proxy (its Deployment's namespace and name), the
// children the orphan sweep's List found missing: "Secret",
// "NetworkPolicy". One set per Cluster (its zero value is empty), bounded
// like taken: past the bound it starts again empty and the next sweep
// marks them again. A nil set remembers nothing.
type absent struct {
	mu sync.Mutex
	m  map[types.NamespacedName][]string
}

// of are the children of k found missing.
func (a *absent) of(k types.NamespacedName) []string {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.m[k])
}

// note records whether kind, a child of k, is missing, and says whether
// it was not marked so already.
func (a *absent) note(k types.NamespacedName, kind string, missing bool) bool {
	if a == nil {
		return missing
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	was := slices.Contains(a.m[k], kind)
	kinds := slices.DeleteFunc(slices.Clone(a.m[k]), func(s string) bool { return s == kind })
	if missing {
		kinds = append(kinds, kind)
	}
	fresh := missing && !was
	if len(kinds) == 0 {
		delete(a.m, k)
		return fresh
	}
	if a.m == nil || len(a.m) >= maxTaken {
		a.m = map[types.NamespacedName][]string{}
	}
	a.m[k] = kinds
	return fresh
}

// keep forgets every proxy of namespace ns but those of live: their
// Deployments are gone, or going, and nothing else would unmark them.
func (a *absent) keep(ns string, live map[types.NamespacedName]bool) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	maps.DeleteFunc(a.m, func(k types.NamespacedName, _ []string) bool { return k.Namespace == ns && !live[k] })
}

// drop forgets every child of k: they were all written.
func (a *absent) drop(k types.NamespacedName) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, k)
}

// noteAbsent marks, among deps (every Deployment of the installation in
// ns, whichever config wrote it, as List read them), the proxies that
// children (per kind, every object of the installation of that kind in
// ns, as List read them; a kind left out is not looked at) hold none of
// their own for: deleted by hand (a Secret while the pod serves, which
// only the next pod misses), or never written by a Create the provider
// did not live to finish, which nothing else remembers. A NetworkPolicy
// is looked for only where the Deployment says it was written with one
// (fenced): another config of the namespace may write none. Get reads a
// marked proxy out of date and Update writes its children again, so it
// is whole again within a poll. A child found is unmarked, and so is a
// proxy whose Deployment is gone; a proxy is logged only when newly
// marked, since one of a config reached through another Cluster is
// unmarked by a later sweep, not by its Update. It sends no request: List
// has read the lists already.
func (d *Driver) noteAbsent(ctx context.Context, ns string, deps []appsv1.Deployment, children map[string][]client.Object) {
	byName := make(map[string]map[string]client.Object, len(children))
	for kind, objs := range children {
		byName[kind] = make(map[string]client.Object, len(objs))
		for _, o := range objs {
			byName[kind][o.GetName()] = o
		}
	}
	var found []string
	live := make(map[types.NamespacedName]bool, len(deps))
	for i := range deps {
		dep := &deps[i]
		if dep.Labels[LabelUID] == "" || dep.DeletionTimestamp != nil {
			continue
		}
		key := client.ObjectKeyFromObject(dep)
		live[key] = true
		young := d.now().Sub(dep.CreationTimestamp.Time) < childCheckAfter
		var lost []string
		for _, kind := range childOrder {
			objs, ok := byName[kind]
			if !ok {
				continue
			}
			if kind == "NetworkPolicy" && !fenced(dep) {
				d.absent.note(key, kind, false)
				continue
			}
			// Another resource's of the name, or one being deleted, is
			// nothing of this proxy: Update names the first.
			if o := objs[dep.Name]; o != nil && o.GetDeletionTimestamp() == nil && childOwned(o, dep, markOf(dep)) == nil {
				d.absent.note(key, kind, false)
				continue
			}
			if young {
				continue
			}
			if d.absent.note(key, kind, true) {
				lost = append(lost, kind)
			}
		}
		if len(lost) > 0 {
			found = append(found, key.String()+" ("+strings.Join(lost, ", ")+")")
		}
	}
	d.absent.keep(ns, live)
	if len(found) > 0 {
		d.logger(ctx).Info("proxies found without some of their children; their next reconcile writes them again", "count", len(found), "proxies", found[:min(len(found), maxAbsentLogged)])
	}
}

// fenced is whether dep was written with a NetworkPolicy.
func fenced(dep *appsv1.Deployment) bool {
	return dep.Annotations[AnnotationNetworkPolicy] == "true"
}

// missingProgress is the progress of a proxy whose children named in
// missing are missing, named in the order they are written.
func missingProgress(missing []string) string {
	slices.SortStableFunc(missing, func(a, b string) int {
		return slices.Index(childOrder, a) - slices.Index(childOrder, b)
	})
	if len(missing) == 1 {
		return "the " + missing[0] + " of the proxy is missing; it is created again"
	}
	last := len(missing) - 1
	return "the " + strings.Join(missing[:last], ", ") + " and " + missing[last] + " of the proxy are missing; they are created again"
}
