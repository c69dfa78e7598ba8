package gcp_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/api/option"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

const keySentinel = "KEY-S3NT1NEL-9f8e7d6c5b4a"

// tokenServer is the key's token_uri: the real OAuth2 JWT flow of
// Google's auth library runs against it.
func tokenServer(t *testing.T, grant *atomic.Bool) (string, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if !grant.Load() {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`))
			return
		}
		_, _ = w.Write([]byte(`{"access_token":"ya29.test-token","expires_in":3600,"token_type":"Bearer"}`))
	}))
	t.Cleanup(ts.Close)
	return ts.URL + "/token", &calls
}

// serviceAccountKey is a real key (a fresh RSA key) in the JSON format
// of a downloaded service-account key.
func serviceAccountKey(t *testing.T, tokenURI string) (key []byte, pemLines []string) {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(rk)
	if err != nil {
		t.Fatal(err)
	}
	p := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	for _, l := range strings.Split(p, "\n") {
		if len(l) >= 32 && !strings.HasPrefix(l, "-----") {
			pemLines = append(pemLines, l)
		}
	}
	key, _ = json.Marshal(map[string]string{
		"type": "service_account", "project_id": testProject, "private_key_id": keySentinel,
		"private_key": p, "client_email": "proxy@" + testProject + ".iam.gserviceaccount.com", "client_id": "1",
		"token_uri": tokenURI,
	})
	return key, pemLines
}

// TestKeySentinel: the service-account key (its private key, its ID, any
// sentinel in it) never appears in an error, a health report or a log
// line, whether the key is malformed, of the wrong type, refused by the
// token endpoint, or accepted.
func TestKeySentinel(t *testing.T) {
	var grant atomic.Bool
	tokenURI, calls := tokenServer(t, &grant)
	good, pemLines := serviceAccountKey(t, tokenURI)
	secrets := append([]string{keySentinel}, pemLines...)

	srv := gcptest.New(t, testProject)
	logs := &testenv.Buffer{}
	log := testLogger(logs)
	conn := &gcp.Connector{Endpoint: srv.URL, Defaults: gcp.Options{Log: &log, Prober: &squid.Prober{Ask: srv.AskSquid}}}
	t.Cleanup(func() { _ = conn.Close() })
	ctx := context.Background()
	var seen []string
	record := func(what string, err error) {
		if err != nil {
			seen = append(seen, fmt.Sprintf("%s: %v | %+v", what, err, err))
		}
	}
	ref := proxy.Ref{Name: "pt-key", Placement: proxy.Placement{Location: testZone}}

	keys := map[string][]byte{
		"malformed JSON":            []byte(`{"type":"service_account","private_key":"` + keySentinel),
		"not a service account key": []byte(`{"type":"authorized_user","refresh_token":"` + keySentinel + `"}`),
		"garbage private key":       []byte(`{"type":"service_account","client_email":"a@b.c","private_key":"` + keySentinel + `","token_uri":"` + tokenURI + `"}`),
	}
	for name, k := range keys {
		d, err := conn.Driver(ctx, testProvider, testConfig(), gcp.Credentials{Key: k})
		record(name+": connect", err)
		if err == nil {
			_, err = d.Get(ctx, ref)
			record(name+": get", err)
			seen = append(seen, fmt.Sprintf("%+v", d.Check(ctx)))
		} else if !proxy.IsPermanent(err) {
			t.Errorf("%s: connect = %s %v; want Permanent", name, proxy.ClassOf(err), err)
		}
	}

	// A real key the token endpoint refuses, then accepts.
	d, err := conn.Driver(ctx, testProvider, testConfig(), gcp.Credentials{Key: good})
	if err != nil {
		t.Fatalf("connect with a valid key: %v", err)
	}
	_, err = d.Get(ctx, ref)
	record("refused key: get", err)
	if !proxy.IsPermanent(err) {
		t.Errorf("Get with a refused key = %s %v; want Permanent", proxy.ClassOf(err), err)
	}
	h := d.Check(ctx)
	if h.Healthy() || h.Targets[0].Reason != proxy.ReasonUnauthorized {
		t.Errorf("Check with a refused key = %+v; want Unauthorized", h.Targets)
	}
	seen = append(seen, fmt.Sprintf("%+v", h))
	grant.Store(true)
	if _, err := d.Get(ctx, ref); !proxy.IsNotFound(err) {
		t.Errorf("Get with an accepted key = %v; want NotFound from the fake", err)
	}
	if a := srv.LastAuthorization(); a != "Bearer ya29.test-token" {
		t.Errorf("the fake saw Authorization %q; want the token the key's JWT flow obtained", a)
	}
	if calls.Load() == 0 {
		t.Error("the token endpoint was never called: the key was not used")
	}

	texts := append(seen, logs.String())
	for _, text := range texts {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("the key leaks (%q…) in: %.300s", s[:12], text)
			}
		}
	}
	for _, s := range seen {
		t.Logf("checked: %.200s", s)
	}
	if len(seen) < 4 {
		t.Errorf("too few failures exercised: %v", seen)
	}
}

// TestConnectorPoolsAndClosesClients: one client set per project and key;
// a rotated key gets a new one; idle ones are closed.
func TestConnectorPoolsAndClosesClients(t *testing.T) {
	srv := gcptest.New(t, testProject)
	conn := &gcp.Connector{
		Endpoint:      srv.URL,
		IdleTimeout:   200 * time.Millisecond,
		ClientOptions: noAuth,
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx := context.Background()
	key := func(n int) gcp.Credentials {
		return gcp.Credentials{Key: []byte(fmt.Sprintf(`{"type":"service_account","n":%d}`, n))}
	}
	for range 3 {
		if _, err := conn.Driver(ctx, testProvider, testConfig(), key(1)); err != nil {
			t.Fatal(err)
		}
	}
	if n := conn.Open(); n != 1 {
		t.Errorf("%d client sets for one key; want 1", n)
	}
	if _, err := conn.Driver(ctx, testProvider, testConfig(), key(2)); err != nil {
		t.Fatal(err)
	}
	if n := conn.Open(); n != 2 {
		t.Errorf("%d client sets after a rotation; want 2 until the old one is idle", n)
	}
	time.Sleep(250 * time.Millisecond)
	d, err := conn.Driver(ctx, testProvider, testConfig(), key(2))
	if err != nil {
		t.Fatal(err)
	}
	if n := conn.Open(); n != 1 {
		t.Errorf("%d client sets after the old key went idle; want 1", n)
	}
	if _, err := d.Get(ctx, proxy.Ref{Name: "pt-pool", Placement: proxy.Placement{Location: testZone}}); !proxy.IsNotFound(err) {
		t.Errorf("Get on the pooled clients = %v", err)
	}
}

// TestConfigEndpoint: a config's own endpoint (gcp.endpoint) is where its
// clients go, over TLS from a CA the client trusts, and clients are pooled
// per endpoint: the same key for another endpoint never reuses them.
func TestConfigEndpoint(t *testing.T) {
	a, b := gcptest.NewTLS(t, testProject), gcptest.NewTLS(t, testProject)
	pool := x509.NewCertPool()
	for _, s := range []*gcptest.Server{a, b} {
		if !pool.AppendCertsFromPEM(s.CAPEM) {
			t.Fatal("the fake's CAPEM holds no certificate")
		}
	}
	trusting := func(context.Context, gcp.Credentials) ([]option.ClientOption, error) {
		return []option.ClientOption{option.WithHTTPClient(&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}})}, nil
	}
	conn := &gcp.Connector{ClientOptions: trusting}
	t.Cleanup(func() { _ = conn.Close() })
	ctx := context.Background()
	creds := gcp.Credentials{Key: []byte(`{"type":"service_account"}`)}
	for _, s := range []*gcptest.Server{a, b} {
		cfg := testConfig()
		cfg.Endpoint = s.URL
		d, err := conn.Driver(ctx, testProvider, cfg, creds)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Get(ctx, proxy.Ref{Name: "pt-endpoint", Placement: proxy.Placement{Location: testZone}}); !proxy.IsNotFound(err) {
			t.Fatalf("Get through %s = %v, want NotFound from the fake", s.URL, err)
		}
		if h := d.Check(ctx); len(h.Targets) != 1 || h.Targets[0].Address != s.URL {
			t.Errorf("Check reports %+v, want the target's address %s", h.Targets, s.URL)
		}
	}
	if n := conn.Open(); n != 2 {
		t.Errorf("%d client sets for one key and two endpoints; want 2", n)
	}
	for name, s := range map[string]*gcptest.Server{"a": a, "b": b} {
		if len(s.Requests()) == 0 {
			t.Errorf("fake %s got no request: its config's endpoint was not used", name)
		}
	}
}
