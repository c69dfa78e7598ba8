package controller

import (
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
)

// TestStripUsageKeepsWhatIsRead: a cached usage keeps what the usage
// count (labels), the tracker's checks (its controller, its config) and
// the cache itself (name, namespace, version) read, in both scopes.
func TestStripUsageKeepsWhatIsRead(t *testing.T) {
	meta := func() metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Name: "uid-1", Namespace: "team-a", ResourceVersion: "7",
			Labels:          map[string]string{xpv2.LabelKeyProviderName: "pods"},
			Annotations:     map[string]string{"a": "b"},
			OwnerReferences: []metav1.OwnerReference{{UID: "uid-1", Name: "web"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "x"}},
		}
	}
	ref := xpv2.TypedReference{APIVersion: "proxy.m.egressproxy.io/v1alpha1", Kind: "PodProxy", Name: "web"}
	ns := &nsv1alpha1.ProviderConfigUsage{ObjectMeta: meta()}
	ns.ProviderConfigReference = xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "pods"}
	ns.ResourceReference = ref
	cl := &clusterv1alpha1.ProviderConfigUsage{ObjectMeta: meta()}
	cl.ProviderConfigReference = xpv2.Reference{Name: "pods"}
	cl.ResourceReference = ref
	for _, u := range []interface {
		metav1.Object
		GetResourceReference() xpv2.TypedReference
	}{ns, cl} {
		if _, err := StripUsage(u); err != nil {
			t.Fatal(err)
		}
		if u.GetName() != "uid-1" || u.GetResourceVersion() != "7" || len(u.GetLabels()) != 1 || len(u.GetOwnerReferences()) != 1 {
			t.Errorf("%T: stripped its metadata's name, version, labels or owner: %+v", u, u)
		}
		if u.GetManagedFields() != nil || u.GetAnnotations() != nil || u.GetResourceReference() != (xpv2.TypedReference{}) {
			t.Errorf("%T: kept managed fields, annotations or the resource reference", u)
		}
	}
	if ns.ProviderConfigReference.Name != "pods" || cl.ProviderConfigReference.Name != "pods" {
		t.Error("the config reference was stripped")
	}
}
