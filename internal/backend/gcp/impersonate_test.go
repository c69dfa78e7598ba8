package gcp_test

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/api/option"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// toFake sends requests for Google's hosts (iamcredentials.googleapis.com)
// to the fake, and records which hosts were asked.
type toFake struct {
	fake  *url.URL
	mu    sync.Mutex
	hosts []string
}

func (f *toFake) RoundTrip(r *http.Request) (*http.Response, error) {
	f.mu.Lock()
	f.hosts = append(f.hosts, r.URL.Host)
	f.mu.Unlock()
	if strings.HasSuffix(r.URL.Hostname(), ".googleapis.com") {
		r = r.Clone(r.Context())
		r.URL.Scheme, r.URL.Host, r.Host = f.fake.Scheme, f.fake.Host, f.fake.Host
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestImpersonation drives the real auth libraries against gcptest's token
// endpoints: the key's account signs a JWT for its own token at the key's
// token_uri, trades it at the IAM Service Account Credentials API for the
// impersonated account's, and the Compute calls carry that one.
func TestImpersonation(t *testing.T) {
	const (
		caller   = "provider@" + testProject + ".iam.gserviceaccount.com"
		target   = "proxies@" + testProject + ".iam.gserviceaccount.com"
		delegate = "broker@" + testProject + ".iam.gserviceaccount.com"
		other    = "admin@" + testProject + ".iam.gserviceaccount.com"
	)
	srv := gcptest.New(t, testProject)
	srv.RequireAuth()
	key := srv.ServiceAccountKey(caller)
	srv.AllowImpersonation(caller, target)
	srv.AllowImpersonation(caller, delegate)
	srv.AllowImpersonation(delegate, other)
	u, _ := url.Parse(srv.URL)
	rt := &toFake{fake: u}
	conn := &gcp.Connector{Endpoint: srv.URL, ClientOptions: func(ctx context.Context, c gcp.Credentials) ([]option.ClientOption, error) {
		return gcp.AuthClientOptions(ctx, c, rt)
	}}
	t.Cleanup(func() { _ = conn.Close() })
	ctx := context.Background()
	ref := proxy.Ref{Name: "pt-imp", Placement: proxy.Placement{Location: testZone}}

	cases := map[string]struct {
		creds   gcp.Credentials
		as      string // the account the Compute calls are made as
		wantErr string
	}{
		"KeyAlone":             {creds: gcp.Credentials{Key: key}, as: caller},
		"Impersonated":         {creds: gcp.Credentials{Key: key, Impersonate: target}, as: target},
		"ThroughADelegate":     {creds: gcp.Credentials{Key: key, Impersonate: other, Delegates: []string{delegate}}, as: other},
		"NotATokenCreator":     {creds: gcp.Credentials{Key: key, Impersonate: other}, wantErr: "iam.serviceAccounts.getAccessToken"},
		"DelegateNotPermitted": {creds: gcp.Credentials{Key: key, Impersonate: target, Delegates: []string{delegate}}, wantErr: "iam.serviceAccounts.getAccessToken"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := conn.Driver(ctx, testProvider, testConfig(), tc.creds)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			_, err = d.Get(ctx, ref)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Get = %v; want an error naming %s", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "PRIVATE KEY") {
					t.Errorf("the error quotes the key: %v", err)
				}
				if !proxy.IsPermanent(err) {
					t.Errorf("Get = %s; want Permanent (only an IAM grant helps)", proxy.ClassOf(err))
				}
				h := d.Check(ctx)
				if h.Healthy() || h.Targets[0].Reason != proxy.ReasonForbidden {
					t.Errorf("Check = %+v; want unhealthy, Forbidden", h)
				}
				t.Logf("Get: %s %v; Check: %s %s", proxy.ClassOf(err), err, h.Targets[0].Reason, h.Targets[0].Message)
				return
			}
			if !proxy.IsNotFound(err) {
				t.Fatalf("Get = %v; want NotFound from the fake (the call was authorized)", err)
			}
			if got := srv.Principal(srv.LastAuthorization()); got != tc.as {
				t.Errorf("Compute was called as %q; want %q", got, tc.as)
			}
		})
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if !slices.Contains(rt.hosts, "iamcredentials.googleapis.com") {
		t.Errorf("token requests went to %v; want the IAM Service Account Credentials API among them", rt.hosts)
	}
}
