package kubernetes

import (
	"slices"
	"testing"
)

func TestPermissions(t *testing.T) {
	has := func(ps []Permission, want Permission) bool { return slices.Contains(ps, want) }
	remote := Permissions("proxies", false)
	own := Permissions("", true)
	for _, tc := range []struct {
		name string
		ps   []Permission
		want Permission
		not  bool
	}{
		{"a remote cluster creates Deployments in the config's namespace", remote, Permission{Group: "apps", Resource: "deployments", Verb: "create", Namespace: "proxies"}, false},
		{"a remote cluster reads its Deployments directly", remote, Permission{Group: "apps", Resource: "deployments", Verb: "list", Namespace: "proxies"}, false},
		{"a remote cluster is never watched", remote, Permission{Group: "apps", Resource: "deployments", Verb: "watch"}, true},
		{"a remote cluster's namespace is read by name", remote, Permission{Resource: "namespaces", Verb: "get", Name: "proxies"}, false},
		{"the own cluster's cache watches cluster-wide", own, Permission{Resource: "pods", Verb: "watch"}, false},
		{"the own cluster's API server is found through the kubernetes Service", own, Permission{Resource: "services", Verb: "get", Namespace: "default"}, false},
		{"a proxy of several replicas gets a disruption budget", remote, Permission{Group: "policy", Resource: "poddisruptionbudgets", Verb: "create", Namespace: "proxies"}, false},
		{"a budget is read directly, never watched", own, Permission{Group: "policy", Resource: "poddisruptionbudgets", Verb: "watch"}, true},
		{"nothing is patched", remote, Permission{Group: "apps", Resource: "deployments", Verb: "patch", Namespace: "proxies"}, true},
		{"deletecollection is not asked for by the health check", remote, Permission{Resource: "secrets", Verb: "deletecollection", Namespace: "proxies"}, true},
		{"a proxy's Secret goes by its mark where granted", OptionalPermissions("proxies"), Permission{Resource: "secrets", Verb: "deletecollection", Namespace: "proxies"}, false},
		{"a proxy's NetworkPolicy goes by its mark where granted", OptionalPermissions("proxies"), Permission{Group: "networking.k8s.io", Resource: "networkpolicies", Verb: "deletecollection", Namespace: "proxies"}, false},
		{"a proxy's missing NetworkPolicy is found where granted", OptionalPermissions("proxies"), Permission{Group: "networking.k8s.io", Resource: "networkpolicies", Verb: "list", Namespace: "proxies"}, false},
		{"listing NetworkPolicies is not asked for by the health check", remote, Permission{Group: "networking.k8s.io", Resource: "networkpolicies", Verb: "list", Namespace: "proxies"}, true},
		{"a proxy's missing Secret is found where granted", OptionalPermissions("proxies"), Permission{Resource: "secrets", Verb: "list", Namespace: "proxies"}, false},
		{"listing Secrets is not asked for by the health check", remote, Permission{Resource: "secrets", Verb: "list", Namespace: "proxies"}, true},
	} {
		if got := has(tc.ps, tc.want); got == tc.not {
			t.Errorf("%s: %v in the list = %t; want %t", tc.name, tc.want, got, !tc.not)
		}
	}
	for _, ps := range [][]Permission{remote, own} {
		seen := map[string]bool{}
		for _, p := range ps {
			if seen[p.String()] {
				t.Errorf("%s is listed twice", p)
			}
			seen[p.String()] = true
		}
	}
}
