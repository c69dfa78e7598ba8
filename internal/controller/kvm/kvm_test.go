package kvm

import (
	"testing"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

func TestKindDescribesItsBackend(t *testing.T) {
	k := New(nil, Options{})
	b, gvks := k.Describe()
	if b.Name != "kvm" || len(gvks) != 2 || b.Connect == nil {
		t.Errorf("Describe() = backend %q (Connect set: %v), kinds %v; want kvm, a Connect, both scopes", b.Name, b.Connect != nil, gvks)
	}
	p := &spec.Placement{}
	*k.Location(p) = "host-a"
	if p.Host != "host-a" {
		t.Errorf("Location writes %+v; want Host", p)
	}
}
