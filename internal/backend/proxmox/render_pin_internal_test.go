package proxmox

import (
	"bytes"
	"context"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kdomanski/iso9660"

	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// seedFiles are the files at the root of the seed ISO iso, by name.
func seedFiles(t *testing.T, iso []byte) map[string]string {
	t.Helper()
	img, err := iso9660.OpenImage(bytes.NewReader(iso))
	if err != nil {
		t.Fatal(err)
	}
	root, err := img.RootDir()
	if err != nil {
		t.Fatal(err)
	}
	kids, err := root.GetChildren()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range kids {
		b, err := io.ReadAll(f.Reader())
		if err != nil {
			t.Fatal(err)
		}
		out[strings.ToLower(f.Name())] = string(b)
	}
	return out
}

// TestRenderingIsPinned: what a Proxmox guest's seed installs (its
// user-data, with squid.conf and the htpasswd; the meta-data is an
// instance ID and the name) for fixed requests,
// pinned with proxy.RenderVersion, so that a change of it is a decision:
// raise RenderVersion, or repin deliberately.
func TestRenderingIsPinned(t *testing.T) {
	pins := map[string]proxytest.RenderPin{
		"Narrow":              {Version: 3, Digest: "f261bf3224ce5dd3"},
		"AuthAllowListOpened": {Version: 3, Digest: "d50606cc3f2ae5ef"},
		"EgressCheck":         {Version: 3, Digest: "362d9d47e3f1491d"},
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d, err := New(Options{Provider: "ClusterProviderConfig home-pve", Config: Config{URL: "https://pve.example:8006", InstallGuestAgent: true}, API: nodesAPI{},
		Resolver: nameResolver{"pve.example": {netip.MustParseAddr("10.30.0.4")}}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for name, req := range proxytest.RenderRequests() {
		t.Run(name, func(t *testing.T) {
			iso, err := d.seed(context.Background(), req, 100123)
			if err != nil {
				t.Fatal(err)
			}
			f := seedFiles(t, iso)
			if f["user-data"] == "" {
				t.Fatalf("the seed holds %d files, no user-data", len(f))
			}
			proxytest.CheckRendering(t, pins[name], f["user-data"])
		})
	}
}
