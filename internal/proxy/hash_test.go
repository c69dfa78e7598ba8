package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
)

// TestHashCarriesTheRenderVersion: an instance made by a provider that
// rendered differently (version 1 hashed the request alone) reads as not
// up to date, so the provider that raised RenderVersion updates it once,
// and a request hashes the same every time.
func TestHashCarriesTheRenderVersion(t *testing.T) {
	req := Request{Name: "web", Proxy: Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}}
	b, err := json.Marshal(Request{Proxy: req.Proxy})
	if err != nil {
		t.Fatal(err)
	}
	v1 := sha256.Sum256(b)
	if got, old := Hash(req), hex.EncodeToString(v1[:])[:16]; got == old {
		t.Errorf("Hash = %s, the version 1 hash: instances rendered before version %d would not be updated", got, RenderVersion)
	}
	again := req
	again.Proxy.AllowedPorts = []int32{} // empty and nil mean the same
	if a, b := Hash(req), Hash(again); a != b {
		t.Errorf("Hash = %s, then %s for the same request", a, b)
	}
}
