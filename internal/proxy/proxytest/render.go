package proxytest

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// RenderPin is what a backend rendered for one fixed Request, as a digest,
// and the proxy.RenderVersion it was pinned at.
type RenderPin struct {
	Version int
	Digest  string
}

// RenderDigest digests what a backend renders (squid.conf, user-data, a
// pod template...), each part length-prefixed so that no two lists of
// parts digest alike.
func RenderDigest(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// CheckRendering fails t when what a backend rendered for one fixed
// Request (parts) is not what pin says, or pin is of another
// proxy.RenderVersion: existing instances get a new rendering only when
// RenderVersion is raised, so a change of rendering must come with a
// decision. Only digests are printed, never the parts, which hold
// password hashes and keys.
func CheckRendering(t testing.TB, pin RenderPin, parts ...string) {
	t.Helper()
	got := RenderDigest(parts...)
	switch {
	case pin.Version != proxy.RenderVersion:
		t.Errorf("pinned at RenderVersion %d, but it is %d: check that this rendering (digest %s) is what instances updated at version %d must get, and pin {%d, %q}",
			pin.Version, proxy.RenderVersion, got, proxy.RenderVersion, proxy.RenderVersion, got)
	case got != pin.Digest:
		t.Errorf("the rendering changed (digest %s, pinned %s at RenderVersion %d), and instances made before keep the old one until their spec changes: "+
			"if they must get it (a denial, a fix), raise proxy.RenderVersion (internal/proxy/proxy.go) with a line in its list and pin {%d, %q}; "+
			"if they need not, pin {%d, %q} deliberately",
			got, pin.Digest, pin.Version, proxy.RenderVersion+1, got, proxy.RenderVersion, got)
	}
}

// RenderRequests are the representative Requests every backend pins its
// rendering of (TestRenderingIsPinned), without Placement or Extension,
// which the backend adds: a narrow proxy, one with auth, a destination
// allow-list and an opened private range, and one with the egress check.
// Credentials are fixed, so the rendering is too.
func RenderRequests() map[string]proxy.Request {
	base := func(name string) proxy.Request {
		return proxy.Request{Name: name, Mark: proxy.Mark{UID: "0f3c2a9e-5b7d-4e1a-9c8b-" + name, InstallationID: "render-pin"},
			Proxy: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}}
	}
	auth := base("auth")
	auth.Proxy.AllowedClientCIDRs = []string{"0.0.0.0/0", "::/0"}
	auth.Proxy.AllowedPorts = []int32{443, 8443}
	auth.Proxy.AllowedDestinations = []string{".example.com", "api.example.org"}
	auth.Proxy.AllowedDestinationCIDRs = []string{"10.20.0.0/16"}
	auth.Proxy.Auth = proxy.Auth{Enabled: true, Username: "proxy", Password: "render-pin-password-0123456789"}
	check := base("check")
	check.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo.example.net/ip", Username: squid.CheckUsername, Password: "render-pin-check-password"}
	return map[string]proxy.Request{"Narrow": base("narrow"), "AuthAllowListOpened": auth, "EgressCheck": check}
}
