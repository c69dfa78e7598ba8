// Package rbac checks the grants the repository ships for people
// (cluster/rbac) on a real API server.
package rbac

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// roles reads the ClusterRoles of a manifest of several documents.
func roles(t *testing.T, path string) map[string]*rbacv1.ClusterRole {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*rbacv1.ClusterRole{}
	for doc := range strings.SplitSeq(string(b), "\n---\n") {
		r := &rbacv1.ClusterRole{}
		if err := yaml.UnmarshalStrict([]byte(doc), r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out[r.Name] = r
	}
	return out
}

// xrdResources are the namespaced resources the Configuration's XRDs
// serve: a namespaced XRD's composites, a legacy one's claims.
func xrdResources(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for _, f := range []string{"xrd-namespaced.yaml", "xrd-legacy.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, "package", "configuration", f))
		if err != nil {
			t.Fatal(err)
		}
		var x struct {
			Spec struct {
				Group      string `json:"group"`
				Scope      string `json:"scope"`
				Names      struct{ Plural string }
				ClaimNames *struct{ Plural string } `json:"claimNames"`
			}
		}
		if err := yaml.Unmarshal(b, &x); err != nil {
			t.Fatal(err)
		}
		switch {
		case x.Spec.ClaimNames != nil:
			out = append(out, x.Spec.Group+"/"+x.Spec.ClaimNames.Plural)
		case x.Spec.Scope == "Namespaced":
			out = append(out, x.Spec.Group+"/"+x.Spec.Names.Plural)
		}
	}
	return out
}

// TestTenantRolesIntegration: the roles of cluster/rbac/tenant.yaml, bound
// with a RoleBinding in a team's namespace, let the team write its
// proxies of every kind and its ProviderConfigs there (and read them
// with the view role), read its usages, and nothing in another
// namespace or cluster-scoped; and they name exactly the namespaced
// resources the provider's CRDs and the Configuration's XRDs serve, so a
// kind added later cannot be left out.
func TestTenantRolesIntegration(t *testing.T) {
	cp, s := testenv.Start(t, controlplane.Options{})
	ctx := context.Background()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cp.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	rs := roles(t, filepath.Join(root, "cluster", "rbac", "tenant.yaml"))
	edit, view := rs["egressproxy-tenant"], rs["egressproxy-tenant-view"]
	if edit == nil || view == nil || len(rs) != 2 {
		t.Fatalf("cluster/rbac/tenant.yaml holds %v; want egressproxy-tenant and egressproxy-tenant-view", slices.Collect(func(yield func(string) bool) {
			for n := range rs {
				yield(n)
			}
		}))
	}

	// What is there to grant: the provider's namespaced resources as the
	// API server serves them, the XRDs' as they declare them.
	served := map[string]bool{}
	dc, err := discovery.NewDiscoveryClientForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, gv := range []string{"proxy.m.egressproxy.io/v1alpha1", "m.egressproxy.io/v1alpha1"} {
		l, err := dc.ServerResourcesForGroupVersion(gv)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if r.Namespaced && !strings.Contains(r.Name, "/") {
				served[strings.Split(gv, "/")[0]+"/"+r.Name] = true
			}
		}
	}
	for _, r := range xrdResources(t, root) {
		served[r] = true
	}
	for _, role := range []*rbacv1.ClusterRole{edit, view} {
		named := map[string]bool{}
		for _, rule := range role.Rules {
			for _, g := range rule.APIGroups {
				for _, r := range rule.Resources {
					named[g+"/"+r] = true
					if !served[g+"/"+r] {
						t.Errorf("%s names %s/%s, which no namespaced CRD or XRD serves", role.Name, g, r)
					}
				}
			}
		}
		for r := range served {
			if !named[r] {
				t.Errorf("%s leaves out %s", role.Name, r)
			}
		}
	}

	for _, r := range []*rbacv1.ClusterRole{edit, view} {
		if err := kube.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"team-a", "team-b"} {
		if err := kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	for user, role := range map[string]string{"alice": edit.Name, "bob": view.Name} {
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: role + "-" + user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		if err := kube.Create(ctx, rb); err != nil {
			t.Fatal(err)
		}
	}
	can := func(user, verb, group, resource, ns string) bool {
		t.Helper()
		resource, sub, _ := strings.Cut(resource, "/")
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               user,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: resource, Subresource: sub},
		}}
		if err := kube.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		return sar.Status.Allowed
	}
	// The RBAC authorizer sees new bindings through its informers, a
	// moment after their creation: wait until both roles are in its view.
	deadline := time.Now().Add(30 * time.Second)
	for !can("alice", "create", "proxy.m.egressproxy.io", "podproxies", "team-a") || !can("bob", "get", "m.egressproxy.io", "providerconfigs", "team-a") {
		if time.Now().After(deadline) {
			t.Fatal("the RoleBindings are not in the authorizer's view after 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, c := range []struct {
		user, verb, group, resource, ns string
		want                            bool
	}{
		{"alice", "create", "proxy.m.egressproxy.io", "podproxies", "team-a", true},
		{"alice", "delete", "proxy.m.egressproxy.io", "kvmproxies", "team-a", true},
		{"alice", "create", "m.egressproxy.io", "providerconfigs", "team-a", true},
		{"alice", "update", "m.egressproxy.io", "providerconfigs", "team-a", true},
		{"alice", "get", "m.egressproxy.io", "providerconfigusages", "team-a", true},
		{"alice", "create", "platform.egressproxy.io", "egressproxies", "team-a", true},
		// Usages are the provider's record, not the team's to change.
		{"alice", "delete", "m.egressproxy.io", "providerconfigusages", "team-a", false},
		// Its status is the provider's.
		{"alice", "update", "proxy.m.egressproxy.io", "podproxies/status", "team-a", false},
		// Another team's namespace, and anything cluster-scoped.
		{"alice", "create", "proxy.m.egressproxy.io", "podproxies", "team-b", false},
		{"alice", "create", "m.egressproxy.io", "clusterproviderconfigs", "", false},
		{"alice", "create", "proxy.egressproxy.io", "podproxies", "", false},
		{"alice", "create", "egressproxy.io", "providerconfigs", "", false},
		{"bob", "list", "proxy.m.egressproxy.io", "gcpproxies", "team-a", true},
		{"bob", "get", "m.egressproxy.io", "providerconfigs", "team-a", true},
		{"bob", "create", "proxy.m.egressproxy.io", "podproxies", "team-a", false},
		{"bob", "list", "proxy.m.egressproxy.io", "gcpproxies", "team-b", false},
	} {
		if got := can(c.user, c.verb, c.group, c.resource, c.ns); got != c.want {
			t.Errorf("%s may %s %s.%s in namespace %q: %v, want %v", c.user, c.verb, c.resource, c.group, c.ns, got, c.want)
		}
	}
}
