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
		"Narrow":              {Version: 3, Digest: "43636dd75754b9e3"},
		"AuthAllowListOpened": {Version: 3, Digest: "975b6d58afcdca47"},
		"EgressCheck":         {Version: 3, Digest: "cff38c4c9a363f84"},
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
