package testenv

import (
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// ProxyResponse is what a GET through a proxy got.
type ProxyResponse struct {
	// Status is the HTTP status code: the destination's, or the proxy's
	// own refusal (403, 407).
	Status int
	// SquidError is Squid's X-Squid-Error header ("ERR_ACCESS_DENIED 0"),
	// empty when the destination answered.
	SquidError string
	// Body of the response.
	Body string
}

// TryGetThroughProxy sends one GET for target through the HTTP proxy
// proxyURL (credentials from its userinfo, if any), on a connection of
// its own, and returns what came back or the error of the connection.
func TryGetThroughProxy(proxyURL, target string) (ProxyResponse, error) {
	u, err := url.Parse(proxyURL)
	if err != nil {
		return ProxyResponse{}, err
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(u), DisableKeepAlives: true}}
	resp, err := c.Get(target)
	if err != nil {
		return ProxyResponse{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return ProxyResponse{Status: resp.StatusCode, SquidError: resp.Header.Get("X-Squid-Error"), Body: string(body)}, err
}

// GetThroughProxy is TryGetThroughProxy for a proxy that is up: a
// connection error (not a refusal, which is a status) is retried for a
// few seconds, then fails t. A 200 whose body is not UpstreamBody (the
// page of Upstream, where target points) is an error of t.
func GetThroughProxy(t testing.TB, proxyURL, target string) ProxyResponse {
	t.Helper()
	redacted := proxyURL
	if u, err := url.Parse(proxyURL); err == nil {
		redacted = u.Redacted()
	}
	// Once, on a loaded machine, both of a test's proxies' first requests
	// got EOF right after Ready.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := TryGetThroughProxy(proxyURL, target)
		if err == nil {
			if r.Status == http.StatusOK && r.Body != UpstreamBody {
				t.Errorf("body of %s through %s = %q; want %q", target, redacted, r.Body, UpstreamBody)
			}
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s through %s: %v", target, redacted, err)
		}
		t.Logf("GET %s through %s: %v; retrying", target, redacted, err)
		time.Sleep(500 * time.Millisecond)
	}
}
