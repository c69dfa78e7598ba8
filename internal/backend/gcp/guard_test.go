package gcp_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/api/option"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestGuardedKey: a tenant's key goes through the guard for every request
// made with it. The normal path works where the platform allows the range
// (the fake on loopback); a token_uri at the provider's loopback is refused
// without a connection; a token endpoint's answer is never quoted.
func TestGuardedKey(t *testing.T) {
	const caller = "tenant@" + testProject + ".iam.gserviceaccount.com"
	srv := gcptest.New(t, testProject)
	srv.RequireAuth()
	key := srv.ServiceAccountKey(caller)
	var hits atomic.Int32
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"invalid_grant","error_description":"SENTINEL-internal-answer"}`))
	}))
	defer refusing.Close()
	withTokenURI := func(uri string) []byte {
		var k map[string]any
		if err := json.Unmarshal(key, &k); err != nil {
			t.Fatal(err)
		}
		k["token_uri"] = uri
		b, _ := json.Marshal(k)
		return b
	}
	loopback := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	conn := &gcp.Connector{Endpoint: srv.URL, ClientOptions: func(_ context.Context, c gcp.Credentials) ([]option.ClientOption, error) {
		return gcp.GuardedClientOptions(c, nil)
	}}
	t.Cleanup(func() { _ = conn.Close() })
	ctx := context.Background()
	ref := proxy.Ref{Name: "pt-guard", Placement: proxy.Placement{Location: testZone}}
	get := func(creds gcp.Credentials) error {
		t.Helper()
		d, err := conn.Driver(ctx, testProvider, testConfig(), creds)
		if err != nil {
			return err
		}
		_, err = d.Get(ctx, ref)
		return err
	}

	if err := get(gcp.Credentials{Key: key, Guard: loopback}); !proxy.IsNotFound(err) {
		t.Fatalf("Get with an allowed token_uri = %v; want NotFound from the fake (the call was authorized)", err)
	}
	if got := srv.Principal(srv.LastAuthorization()); got != caller {
		t.Errorf("Compute was called as %q; want %q", got, caller)
	}

	err := get(gcp.Credentials{Key: withTokenURI(refusing.URL + "/token"), Guard: loopback})
	if err == nil || strings.Contains(err.Error(), "SENTINEL") || !strings.Contains(err.Error(), "not shown to tenants") {
		t.Errorf("Get with a refusing token_uri = %v; want the status without the answer", err)
	}
	if !proxy.IsPermanent(err) {
		t.Errorf("a token endpoint's 400 is %s; want Permanent as ever", proxy.ClassOf(err))
	}

	seen := hits.Load()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(refusing.URL, "http://"))
	for _, uri := range []string{refusing.URL + "/token", "http://localhost:" + port + "/token", "http://[::ffff:127.0.0.1]:" + port + "/token"} {
		err := get(gcp.Credentials{Key: withTokenURI(uri), Guard: netguard.New(netguard.Options{})})
		if !netguard.IsRefused(err) {
			t.Errorf("Get with token_uri %s = %v; want a refusal", uri, err)
		}
	}
	if n := hits.Load() - seen; n != 0 {
		t.Errorf("the token endpoint on loopback was asked %d times through a guard refusing it; want 0", n)
	}
}
