package gcp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestRenderOnlyChangeKeepsAnEphemeralAddress: an instance an earlier
// provider made (its spec label the same request's hash at an earlier
// RenderVersion, its squid.conf rendered otherwise) gets the new files in
// metadata; an Ephemeral one is not restarted, which would give up its
// external address, and takes them at its next boot; a Static one, whose
// address stays, restarts. A change of the request restarts either.
func TestRenderOnlyChangeKeepsAnEphemeralAddress(t *testing.T) {
	for name, tc := range map[string]struct {
		address     string
		userChange  bool
		wantRestart bool
	}{
		"EphemeralUpgraded":    {address: gcp.AddressEphemeral, wantRestart: false},
		"StaticUpgraded":       {address: gcp.AddressStatic, wantRestart: true},
		"EphemeralSpecChanged": {address: gcp.AddressEphemeral, userChange: true, wantRestart: true},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			req := request("pt-render", "0c8f6a1e-5555-4e2a-9c3f-000000000021")
			req.Extension = gcp.Exposure{AddressType: tc.address}
			var inst proxy.Instance
			for range 3 { // a Static address is reserved first
				var err error
				if inst, err = f.driver.Create(ctx, req); err != nil {
					t.Fatal(err)
				}
				f.srv.SettleAll()
				if _, ok := f.srv.Instance(testZone, req.Name); ok {
					break
				}
			}
			want := fixtureMetadataItem(f, req.Name, gcp.MetadataSquidConf)

			// As an earlier provider left it.
			in, err := f.opts.API.GetInstance(ctx, testZone, req.Name)
			if err != nil {
				t.Fatal(err)
			}
			in.Labels[gcp.LabelSpec] = proxy.HashAt(req, proxy.RenderVersion-1)
			for _, it := range in.Metadata.Items {
				if it.GetKey() == gcp.MetadataSquidConf {
					old := strings.Replace(want, "include ", "# include ", 1)
					it.Value = &old
				}
			}
			if _, err := f.opts.API.UpdateInstance(ctx, testZone, in, "NO_EFFECT"); err != nil {
				t.Fatal(err)
			}
			f.srv.SettleAll()

			if tc.userChange {
				req.Proxy.AllowedPorts = []int32{443, 8443}
				want = ""
			}
			f.srv.ResetRequests()
			if _, err := f.driver.Update(ctx, refOf(inst, req), req); err != nil {
				t.Fatal(err)
			}
			f.srv.SettleAll()
			reqs := fmt.Sprint(f.srv.Requests())
			if got := strings.Contains(reqs, "minimalAction=RESTART"); got != tc.wantRestart {
				t.Errorf("the update restarts the instance: %v, want %v (requests: %s)", got, tc.wantRestart, reqs)
			}
			got := fixtureMetadataItem(f, req.Name, gcp.MetadataSquidConf)
			if want != "" && got != want {
				t.Errorf("metadata's squid.conf is not the one this provider renders:\n%s", got)
			}
			body, _ := f.srv.Instance(testZone, req.Name)
			labels, _ := body["labels"].(map[string]any)
			if labels[gcp.LabelSpec] != proxy.Hash(req) {
				t.Errorf("spec label = %v, want %s: the instance would be updated again on every poll", labels[gcp.LabelSpec], proxy.Hash(req))
			}
		})
	}
}
