package gcp

import (
	"maps"
	"slices"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// TestRenderingIsPinned: what a GCP instance is given (its metadata:
// user-data, startup script, squid.conf, htpasswd and the egress check's
// files) for fixed requests, pinned with proxy.RenderVersion, so that a
// change of it is a decision: raise RenderVersion, or repin deliberately.
func TestRenderingIsPinned(t *testing.T) {
	pins := map[string]proxytest.RenderPin{
		"Narrow":              {Version: 3, Digest: "9b7091ebc0465378"},
		"AuthAllowListOpened": {Version: 3, Digest: "2cb24ca3c0508650"},
		"EgressCheck":         {Version: 3, Digest: "8dae3f4789f4639a"},
	}
	d := New(Options{Provider: "ClusterProviderConfig gcp-pin", Config: Config{Project: "pin", Network: "default",
		Images: map[string]string{"ubuntu": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"}, MachineTypes: map[string]string{"small": "e2-small"}}})
	for name, req := range proxytest.RenderRequests() {
		t.Run(name, func(t *testing.T) {
			req.Placement.Location, req.Placement.MachineType, req.Placement.Image = "europe-west1-b", "small", "ubuntu"
			req.Extension = Exposure{AddressType: AddressEphemeral}
			s, err := d.resolveSpec(req)
			if err != nil {
				t.Fatal(err)
			}
			md := s.metadata()
			var parts []string
			for _, k := range slices.Sorted(maps.Keys(md)) {
				parts = append(parts, k, md[k])
			}
			proxytest.CheckRendering(t, pins[name], parts...)
		})
	}
}
