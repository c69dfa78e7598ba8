package kvm

import (
	"strings"
	"testing"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
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

// A KVMProxy that left its host, machine type and image to a config of one
// each keeps them when the config gains a second.
func TestRequestKeepsTheRecordedPlacement(t *testing.T) {
	cfg := &external.Config{Name: "ClusterProviderConfig kvm", Spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{
		Hosts:        []spec.KVMHost{{Name: "b"}, {Name: "a"}},
		MachineTypes: map[string]spec.KVMMachineType{"small": {}, "large": {}},
		Images:       map[string]spec.KVMImage{"debian": {}, "ubuntu": {}},
	}}}
	o := &spec.ProxyObservation{Placement: &spec.Placement{Host: "a", MachineType: "small", Image: "debian"}}
	req := proxy.Request{Placement: external.Recorded(o, New(nil, Options{}).Location)}
	if err := request(cfg, &spec.KVMProxyParameters{}, &req); err != nil {
		t.Fatal(err)
	}
	if want := (proxy.Placement{Location: "a", MachineType: "small", Image: "debian"}); req.Placement != want {
		t.Errorf("placement %+v; want the recorded %+v", req.Placement, want)
	}
	// Without a record (before the instance exists) the config's several
	// hosts need a choice.
	req = proxy.Request{}
	if err := request(cfg, &spec.KVMProxyParameters{}, &req); err == nil || !strings.Contains(err.Error(), "spec.forProvider.host is required") {
		t.Errorf("without a record: %v; want spec.forProvider.host is required", err)
	}
}

// TestBlockSaysTheAddressIsTheGuests: the address comes from the guest
// agent or the DHCP lease, so the controller marks a request whose guest
// a tenant writes (external.Config.TenantGuest).
func TestBlockSaysTheAddressIsTheGuests(t *testing.T) {
	b, ok := New(nil, Options{}).Backend.Block(&spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}})
	if !ok || !b.GuestReportsAddress {
		t.Errorf("Block() = GuestReportsAddress %v, %v; want true", b.GuestReportsAddress, ok)
	}
}
