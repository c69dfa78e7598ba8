package gcp

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	gcpbackend "github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestRequestExposure: the address and firewall reach the driver as the
// gcp backend's Extension, and hash as they did when the contract held
// them (so no existing instance reads as changed).
func TestRequestExposure(t *testing.T) {
	s := spec.ProviderConfigSpec{GCP: &spec.GCPConfig{Zones: []string{"europe-west1-b"},
		MachineTypes: map[string]spec.GCPMachineType{"small": {}}, Images: map[string]spec.GCPImage{"debian": {}}}}
	cfg := &external.Config{Name: "ClusterProviderConfig gcp", Spec: s}
	cases := map[string]struct {
		params   spec.GCPProxyParameters
		want     gcpbackend.Exposure
		wantHash string
	}{
		"Defaults": {
			want:     gcpbackend.Exposure{AddressType: gcpbackend.AddressEphemeral, ManageFirewall: true},
			wantHash: `{"AddressType":"Ephemeral","RetainAddress":false,"ManageFirewall":true,"ServiceType":""}`,
		},
		"StaticRetainedNoFirewall": {
			params:   spec.GCPProxyParameters{Address: &spec.GCPAddress{Type: gcpbackend.AddressStatic, Retain: true}, Firewall: &spec.GCPFirewall{Manage: false}},
			want:     gcpbackend.Exposure{AddressType: gcpbackend.AddressStatic, RetainAddress: true},
			wantHash: `{"AddressType":"Static","RetainAddress":true,"ManageFirewall":false,"ServiceType":""}`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req := proxy.Request{}
			if err := request(cfg, &tc.params, &req); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, req.Extension); diff != "" {
				t.Errorf("request(...).Extension: -want, +got:\n%s", diff)
			}
			b, _ := json.Marshal(req.Extension.HashInput())
			if diff := cmp.Diff(tc.wantHash, string(b)); diff != "" {
				t.Errorf("HashInput: -want, +got:\n%s", diff)
			}
			if req.Placement.Location != "europe-west1-b" {
				t.Errorf("zone %q; want the config's first", req.Placement.Location)
			}
		})
	}
}

// A proxy that left its keys to the config keeps the ones it was made
// with when the config gains more, or puts another zone first.
func TestRequestKeepsTheRecordedPlacement(t *testing.T) {
	s := spec.ProviderConfigSpec{GCP: &spec.GCPConfig{Zones: []string{"europe-west1-c", "europe-west1-b"},
		MachineTypes: map[string]spec.GCPMachineType{"small": {}, "large": {}}, Images: map[string]spec.GCPImage{"debian": {}, "ubuntu": {}}}}
	cfg := &external.Config{Name: "ClusterProviderConfig gcp", Spec: s}
	req := proxy.Request{Placement: external.Recorded(&spec.ProxyObservation{Placement: &spec.Placement{Zone: "europe-west1-b", MachineType: "small", Image: "debian"}}, New(nil, Options{}).Location)}
	if err := request(cfg, &spec.GCPProxyParameters{}, &req); err != nil {
		t.Fatal(err)
	}
	if want := (proxy.Placement{Location: "europe-west1-b", MachineType: "small", Image: "debian"}); req.Placement != want {
		t.Errorf("placement %+v; want the recorded %+v", req.Placement, want)
	}
}
