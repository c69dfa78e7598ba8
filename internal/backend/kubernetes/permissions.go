package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authzv1 "k8s.io/api/authorization/v1"
)

// Permission is one verb on one resource (or "resource/subresource") the
// driver uses in a target cluster: in Namespace, or cluster-wide when
// Namespace is empty; on the object Name alone when Name is set.
type Permission struct {
	Group, Resource, Verb, Namespace, Name string
}

func (p Permission) String() string {
	s := p.Verb + " " + p.Resource
	if p.Group != "" {
		s += "." + p.Group
	}
	if p.Name != "" {
		s += " " + p.Name
	}
	if p.Namespace != "" {
		s += " in " + p.Namespace
	} else {
		s += " cluster-wide"
	}
	return s
}

// Attributes are p as a SelfSubjectAccessReview asks for it.
func (p Permission) Attributes() *authzv1.ResourceAttributes {
	resource, sub, _ := strings.Cut(p.Resource, "/")
	return &authzv1.ResourceAttributes{Group: p.Group, Resource: resource, Subresource: sub, Verb: p.Verb, Namespace: p.Namespace, Name: p.Name}
}

// Permissions is every verb the driver uses in a target cluster whose
// proxies live in namespace: what Create, Update, Delete, Get, List and
// Check send there, and the reads of the cluster's own networks that
// Squid and the NetworkPolicy deny (without them a proxy could reach the
// API server). With cached, Deployments, pods and Services are listed
// from a cache, which lists and watches them cluster-wide. An empty
// namespace asks for every namespace (the provider's own cluster, where a
// config may name any).
//
// The list is the driver's, kept beside the calls it describes, with
// OptionalPermissions; docs/pod-proxy.md ("RBAC in the target cluster")
// gives the same table.
func Permissions(namespace string, cached bool) []Permission {
	in := func(group, resource string, verbs ...string) []Permission {
		ps := make([]Permission, len(verbs))
		for i, v := range verbs {
			ps[i] = Permission{Group: group, Resource: resource, Verb: v, Namespace: namespace}
		}
		return ps
	}
	cluster := func(group, resource string, verbs ...string) []Permission {
		ps := in(group, resource, verbs...)
		for i := range ps {
			ps[i].Namespace = ""
		}
		return ps
	}
	// cachedOr is what a read of resource needs: a cache's list and watch
	// cluster-wide where the driver has one; and the verbs the driver reads
	// with directly (a cache's misses and uncached clients).
	cachedOr := func(group, resource string, direct ...string) []Permission {
		if !cached {
			return in(group, resource, direct...)
		}
		return append(cluster(group, resource, "list", "watch"), in(group, resource, slices.DeleteFunc(direct, func(v string) bool { return v == "list" })...)...)
	}
	var ps []Permission
	for _, p := range [][]Permission{
		cachedOr("", "pods", "list"),
		cachedOr("apps", "deployments", "get", "list"),
		in("apps", "deployments", "create", "update", "delete"),
		// The children's blockOwnerDeletion, where the admission plugin
		// that checks it is on.
		in("apps", "deployments/finalizers", "update"),
		cachedOr("", "services", "get"),
		in("", "services", "create", "update", "delete"),
		// delete: the children a Deployment left without an owner
		// (leftovers.go).
		in("", "secrets", "get", "create", "update", "delete"),
		in("networking.k8s.io", "networkpolicies", "get", "create", "update", "delete"),
		// The budget of a proxy of two or more replicas.
		in("policy", "poddisruptionbudgets", "get", "create", "update", "delete"),
		{{Resource: "namespaces", Verb: "get", Name: namespace}},
		// The cluster's own networks (networks.go).
		{{Resource: "services", Verb: "get", Namespace: "default"}},
		{{Group: "discovery.k8s.io", Resource: "endpointslices", Verb: "list", Namespace: "default"}},
		cluster("networking.k8s.io", "servicecidrs", "list"),
		cluster("", "nodes", "list"),
	} {
		for _, q := range p {
			if !slices.Contains(ps, q) {
				ps = append(ps, q)
			}
		}
	}
	return ps
}

// OptionalPermissions are what the driver uses in namespace where the
// target cluster grants it, and does without otherwise, so the health
// check does not ask for them: deletecollection of a proxy's Secret and
// NetworkPolicy by its mark (deleteChildren), without which the garbage
// collector deletes them; and the lists of Secrets and NetworkPolicies by
// the installation's mark (List), without which a proxy whose Secret or
// NetworkPolicy is missing is not found (noteAbsent) nor one left without
// its Deployment reported.
func OptionalPermissions(namespace string) []Permission {
	return []Permission{
		{Resource: "secrets", Verb: "deletecollection", Namespace: namespace},
		{Resource: "secrets", Verb: "list", Namespace: namespace},
		{Group: "networking.k8s.io", Resource: "networkpolicies", Verb: "deletecollection", Namespace: namespace},
		{Group: "networking.k8s.io", Resource: "networkpolicies", Verb: "list", Namespace: namespace},
	}
}

// missingPermissions asks the target cluster, with one
// SelfSubjectAccessReview per permission (which every identity may
// create), which of ps its identity lacks.
func (d *Driver) missingPermissions(ctx context.Context, ps []Permission) ([]Permission, error) {
	var missing []Permission
	for _, p := range ps {
		r := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: p.Attributes()}}
		if err := d.client.Create(ctx, r); err != nil {
			return nil, fmt.Errorf("cannot review the permissions of this config's identity (%s): %w", p, d.quietly(err))
		}
		if !r.Status.Allowed {
			missing = append(missing, p)
		}
	}
	return missing, nil
}

// missingError names what the identity lacks and where the full table is.
func missingError(ps []Permission) error {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return fmt.Errorf("this config's identity may not %s, which PodProxies need: grant them (docs/pod-proxy.md, RBAC in the target cluster)", strings.Join(s, ", "))
}
