package proxmox

import (
	"context"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestTenantAPIGuarded: a namespaced config's API URL at the provider's
// loopback is refused before anything connects; one the platform allowed
// answers, but what it says (its error text, its per-parameter errors) is
// not quoted, while a platform config's client keeps it.
func TestTenantAPIGuarded(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"data":null,"message":"SENTINEL-internal-answer","errors":{"vmid":"SENTINEL-param"}}`))
	}))
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	creds := func(context.Context) (Credentials, error) {
		return Credentials{Token: "root@pam!t=00000000-0000-0000-0000-000000000000", CA: ca}, nil
	}
	client := func(guard *netguard.Guard) *Client {
		c, err := NewClient(srv.URL, creds, false, 0, &Transports{})
		if err != nil {
			t.Fatal(err)
		}
		c.guard = guard
		return c
	}

	_, err := client(netguard.New(netguard.Options{})).Version(context.Background())
	if !netguard.IsRefused(err) || proxy.ClassOf(classify(err)) != proxy.ClassPermanent {
		t.Fatalf("Version on loopback = %v, want a Permanent refusal", err)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the API on loopback was asked %d times, want 0", n)
	}

	allowed := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	_, err = client(allowed).Version(context.Background())
	if err == nil || strings.Contains(err.Error(), "SENTINEL") {
		t.Fatalf("Version of a tenant's API = %v, want an error without its answer", err)
	}
	if !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "what proxmox.url answered is not shown") {
		t.Errorf("Version = %v, want the status and the fixed text", err)
	}
	if proxy.ClassOf(classify(err)) != proxy.ClassPermanent {
		t.Errorf("a tenant's 400 is %s, want Permanent as ever", proxy.ClassOf(classify(err)))
	}
	if _, err := client(nil).Version(context.Background()); err == nil || !strings.Contains(err.Error(), "SENTINEL-internal-answer") {
		t.Errorf("Version on a platform config = %v, want the API's own text", err)
	}
}

// TestTransportsUseTheEnvironmentsProxy: the API is reached through
// HTTPS_PROXY/NO_PROXY as the Kubernetes and Google clients are; through a
// guard, the target is checked before it is handed to the proxy
// (netguard's TestThroughAProxy).
func TestTransportsUseTheEnvironmentsProxy(t *testing.T) {
	tr, err := (&Transports{}).get(nil, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.ValueOf(tr.Proxy).Pointer() != reflect.ValueOf(http.ProxyFromEnvironment).Pointer() {
		t.Error("the platform's transport does not use http.ProxyFromEnvironment")
	}
	g := netguard.New(netguard.Options{})
	tr, err = (&Transports{}).get(nil, false, g)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Proxy == nil {
		t.Fatal("the tenant's transport has no proxy function")
	}
	if _, err := tr.DialContext(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", "8006")); !netguard.IsRefused(err) {
		t.Errorf("the tenant's transport dialled loopback: %v", err)
	}
}

// TestTenantRedirectIsNotNamed: a tenant's API that redirects to a name
// the guard refuses is not followed, and the refusal names neither the
// target nor its host: where a redirect leads is what the endpoint
// answered.
func TestTenantRedirectIsNotNamed(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, "https://sentinel-target.localhost:8443/x", http.StatusFound)
	}))
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	c, err := NewClient(srv.URL, func(context.Context) (Credentials, error) {
		return Credentials{Token: "root@pam!t=00000000-0000-0000-0000-000000000000", CA: ca}, nil
	}, false, 0, &Transports{})
	if err != nil {
		t.Fatal(err)
	}
	c.guard = netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	_, err = c.Version(context.Background())
	if !netguard.IsRefused(err) || strings.Contains(strings.ToLower(err.Error()), "sentinel") || !strings.Contains(err.Error(), "a redirect from") {
		t.Errorf("Version through a redirect = %v, want a refusal of a redirect that names no target", err)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("the API was asked %d times, want 1", n)
	}
}
