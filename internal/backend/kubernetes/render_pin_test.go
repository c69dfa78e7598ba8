package kubernetes

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestRenderingIsPinned: what a PodProxy is given (its Secret's data,
// squid.conf and htpasswd among them, and its Deployment's pod template)
// for fixed requests and cluster networks, pinned with
// proxy.RenderVersion, so that a change of it is a decision: raise
// RenderVersion, or repin deliberately (a change of the pod template
// alone that pods must get raises templateVersion instead).
func TestRenderingIsPinned(t *testing.T) {
	pins := map[string]proxytest.RenderPin{
		"Narrow":              {Version: 3, Digest: "995e028269cd691a"},
		"AuthAllowListOpened": {Version: 3, Digest: "15a66149a0d07657"},
		"EgressCheck":         {Version: 3, Digest: "a0c23a2017b099af"},
	}
	nets := []string{"10.96.0.0/12", "10.244.0.0/16", "192.168.1.10"}
	d := New(Options{Config: Config{Namespace: "egress", Image: "registry.example/squid:pin", EgressCheck: true}, Now: func() time.Time { return now }})
	for name, req := range proxytest.RenderRequests() {
		t.Run(name, func(t *testing.T) {
			files, err := squid.Render(req.Proxy, squidOptions(req, nets))
			if err != nil {
				t.Fatal(err)
			}
			dep := d.buildDeployment(req, files, "spec")
			sec := d.buildSecret(dep, req, files)
			tmpl, err := json.Marshal(dep.Spec.Template)
			if err != nil {
				t.Fatal(err)
			}
			parts := []string{string(tmpl)}
			for _, k := range slices.Sorted(maps.Keys(sec.Data)) {
				parts = append(parts, k, string(sec.Data[k]))
			}
			proxytest.CheckRendering(t, pins[name], parts...)
		})
	}
}
