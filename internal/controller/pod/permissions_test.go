package pod

import (
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
)

// TestGrantHoldsWhatTheDriverUses: the ClusterRole of
// cluster/rbac/podproxy.yaml grants every permission the driver uses in
// the provider's own cluster, the optional ones too (deletecollection by
// the proxy's mark), except Secrets, which Crossplane's RBAC manager
// grants every provider with every verb.
func TestGrantHoldsWhatTheDriverUses(t *testing.T) {
	b, err := os.ReadFile("../../../cluster/rbac/podproxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.ClusterRole
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var r rbacv1.ClusterRole
		if err := d.Decode(&r); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if r.Kind == "ClusterRole" && r.Name == ClusterRole {
			role = &r
		}
	}
	if role == nil {
		t.Fatalf("cluster/rbac/podproxy.yaml holds no ClusterRole %s", ClusterRole)
	}
	grants := func(p kubernetes.Permission) bool {
		return slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, p.Group) && slices.Contains(r.Resources, p.Resource) &&
				(slices.Contains(r.Verbs, p.Verb) || slices.Contains(r.Verbs, rbacv1.VerbAll)) &&
				(len(r.ResourceNames) == 0 || slices.Contains(r.ResourceNames, p.Name))
		})
	}
	for _, p := range append(slices.Clone(required), kubernetes.OptionalPermissions("")...) {
		if p.Group == "" && p.Resource == "secrets" {
			continue
		}
		if !grants(p) {
			t.Errorf("ClusterRole %s does not grant %s", ClusterRole, p)
		}
	}
}
