package crdgate

import (
	"context"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/gate"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestGate: an established CRD opens its served kinds, also while it is
// being deleted (its objects' finalizers need the controller); a CRD not
// established keeps them closed.
func TestGate(t *testing.T) {
	gvk := schema.GroupVersionKind{Group: "proxy.m.egressproxy.io", Version: "v1alpha1", Kind: "PodProxy"}
	crd := func(established bool, deleting bool) *apiextensionsv1.CustomResourceDefinition {
		c := &apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: gvk.Group, Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: gvk.Kind},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: gvk.Version, Served: true}},
		}}
		st := apiextensionsv1.ConditionFalse
		if established {
			st = apiextensionsv1.ConditionTrue
		}
		c.Status.Conditions = []apiextensionsv1.CustomResourceDefinitionCondition{{Type: apiextensionsv1.Established, Status: st}}
		if deleting {
			now := metav1.Now()
			c.DeletionTimestamp = &now
		}
		return c
	}
	for name, tc := range map[string]struct {
		crd  *apiextensionsv1.CustomResourceDefinition
		open bool
	}{
		"established":                {crd(true, false), true},
		"established, being deleted": {crd(true, true), true},
		"not established":            {crd(false, false), false},
	} {
		t.Run(name, func(t *testing.T) {
			g := new(gate.Gate[schema.GroupVersionKind])
			r := &Reconciler{Log: logging.NewNopLogger(), Gate: g}
			if _, err := r.Reconcile(context.Background(), tc.crd); err != nil {
				t.Fatal(err)
			}
			// Setting it true changes nothing when the reconciler opened it.
			if open := !g.Set(gvk, true); open != tc.open {
				t.Errorf("gate open = %v, want %v", open, tc.open)
			}
		})
	}
}
