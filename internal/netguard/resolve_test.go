package netguard

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

// serverResolver fails every lookup as the cluster DNS Service would.
type serverResolver struct{ timeout bool }

func (r serverResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if r.timeout {
		return nil, &net.DNSError{Err: "i/o timeout", Name: host, Server: "10.255.255.53:53", IsTimeout: true}
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, Server: "10.255.255.53:53", IsNotFound: true}
}

// TestUnresolvableEndpointNamesNoResolver: a tenant whose endpoint's name
// does not resolve reads that the name cannot be resolved, and why in
// general words, never the address of the provider's DNS server; callers
// still tell a missing name from a timeout.
func TestUnresolvableEndpointNamesNoResolver(t *testing.T) {
	const name = "pve.tenant.example"
	failing := &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("unreachable")
	}}
	for _, tc := range []struct {
		desc     string
		r        Resolver
		words    string
		notFound bool
		timeout  bool
	}{
		{"a name the server does not know", serverResolver{}, "cannot resolve " + name + ": no such host", true, false},
		{"a server that does not answer", serverResolver{timeout: true}, "cannot resolve " + name + ": the lookup timed out", false, true},
		{"a server that cannot be reached", failing, "cannot resolve " + name, false, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			g := New(Options{Resolver: tc.r})
			_, direct := g.CheckHost(context.Background(), name)
			hc := &http.Client{Transport: g.Transport(&http.Transport{Proxy: func(*http.Request) (*url.URL, error) { return nil, nil }}), CheckRedirect: g.NoRedirects}
			resp, err := hc.Get("https://" + name + ":8006/api2/json/version")
			if err == nil {
				_ = resp.Body.Close()
				t.Fatal("the request succeeded")
			}
			for _, shown := range []string{direct.Error(), Quiet(err, "proxmox.url").Error()} {
				if !strings.Contains(shown, tc.words) {
					t.Errorf("a tenant sees %q; want it to say %q", shown, tc.words)
				}
				if strings.Contains(shown, ":53") || strings.Contains(shown, "10.255.255.53") || strings.Contains(shown, "127.0.0.") {
					t.Errorf("a tenant sees %q: it names the provider's DNS server", shown)
				}
			}
			var de *net.DNSError
			if !errors.As(Quiet(err, "proxmox.url"), &de) {
				t.Fatalf("Quiet(%v) is no *net.DNSError for callers", err)
			}
			if de.IsNotFound != tc.notFound || de.IsTimeout != tc.timeout {
				t.Errorf("classification: IsNotFound %v IsTimeout %v; want %v %v", de.IsNotFound, de.IsTimeout, tc.notFound, tc.timeout)
			}
		})
	}
}
