package gcp

import (
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestCheckEndpoint: the controller refuses what admission refuses, for a
// config written past it; the tokens never go in clear text or to a host
// hidden behind user info.
func TestCheckEndpoint(t *testing.T) {
	for e, ok := range map[string]bool{
		"": true, "https://compute.googleapis.com": true, "https://compute-x.p.googleapis.com/": true, "https://127.0.0.1:8443": true,
		"http://compute.googleapis.com": false, "https://compute.googleapis.com@evil.example.com": false,
		"https://compute.example.com/?x=1": false, "https://compute.example.com/#f": false, "https://": false, "compute.googleapis.com": false,
	} {
		err := checkEndpoint(e)
		if (err == nil) != ok {
			t.Errorf("checkEndpoint(%q) = %v, want ok=%v", e, err, ok)
		}
		if err != nil && (!proxy.IsPermanent(err) || !strings.Contains(err.Error(), "spec.gcp.endpoint must be an https:// URL")) {
			t.Errorf("checkEndpoint(%q) = %v, want a Permanent error naming spec.gcp.endpoint", e, err)
		}
	}
}
