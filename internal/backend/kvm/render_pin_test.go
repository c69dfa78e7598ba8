package kvm

import (
	"context"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// TestRenderingIsPinned: what a KVM guest is given (its seed's user-data,
// with squid.conf and the htpasswd, and meta-data) for fixed requests,
// pinned with proxy.RenderVersion, so that a change of it is a decision:
// raise RenderVersion, or repin deliberately.
func TestRenderingIsPinned(t *testing.T) {
	pins := map[string]proxytest.RenderPin{
		"Narrow":              {Version: 3, Digest: "444813ce2623130e"},
		"AuthAllowListOpened": {Version: 3, Digest: "40c5fac2acc32c6d"},
		"EgressCheck":         {Version: 3, Digest: "5b1b9ceccbd41d18"},
	}
	e := newTestEnv(t)
	for name, req := range proxytest.RenderRequests() {
		t.Run(name, func(t *testing.T) {
			req.Placement = e.request(req.Name, req.Mark.UID).Placement
			p, err := e.d.plan(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			proxytest.CheckRendering(t, pins[name], p.userData, p.metaData)
		})
	}
}
