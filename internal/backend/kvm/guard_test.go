package kvm

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// rawServer answers every connection on addr with answer, and counts
// them.
func rawServer(t *testing.T, addr, answer string) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			go func() {
				defer c.Close()
				_, _ = bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte(answer))
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return ln.Addr().String(), &n
}

func onlyAllowing(t *testing.T, cidrs ...string) *netguard.Guard {
	t.Helper()
	var ps []netip.Prefix
	for _, c := range cidrs {
		ps = append(ps, netip.MustParsePrefix(c))
	}
	return netguard.New(netguard.Options{Allowed: ps, ContentAllowed: []netip.Prefix{mirrorRange}})
}

// TestImage_tenantDownloadsNeverReachTheProvidersNetwork: a namespaced
// config's catalogue image, and a proxy's own image URL, at the provider's
// loopback, directly or through a redirect from a server the tenant may
// name: Create fails naming the refusal, and the loopback server is never
// connected to.
func TestImage_tenantDownloadsNeverReachTheProvidersNetwork(t *testing.T) {
	inner, hits := rawServer(t, "127.0.0.1:0", "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
	redirect := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://"+inner+"/metadata", http.StatusFound)
	}))
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	redirect.Listener = l
	redirect.Start()
	defer redirect.Close()
	guard := onlyAllowing(t, "127.0.0.2/32")

	for name, setup := range map[string]func(e *testEnv){
		"CatalogueImageOnLoopback": func(e *testEnv) {
			e.cfg.Guard = guard
			e.cfg.Images["debian"] = Image{URL: "http://" + inner + "/debian.qcow2"}
		},
		"CatalogueImageRedirectedToLoopback": func(e *testEnv) {
			e.cfg.Guard = guard
			e.cfg.Images["debian"] = Image{URL: redirect.URL + "/debian.qcow2"}
		},
		// A proxy's own URL is a tenant's on any config, a platform's too.
		"ProxyImageURLOnAClusterConfig": func(e *testEnv) {
			e.cfg.URLGuard = guard
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t, setup)
			req := e.request("web", "uid-1")
			if name == "ProxyImageURLOnAClusterConfig" {
				req.Placement.Image = redirect.URL + "/debian.qcow2"
			}
			err := e.createError(req)
			if !netguard.IsRefused(err) || proxy.ClassOf(err) != proxy.ClassPermanent {
				t.Fatalf("Create = %v (%s), want a Permanent refusal", err, proxy.ClassOf(err))
			}
			if !strings.Contains(err.Error(), "does not connect to") {
				t.Errorf("Create = %v, want it to say what was refused", err)
			}
			if name == "ProxyImageURLOnAClusterConfig" && strings.Contains(err.Error(), "namespaced") {
				t.Errorf("Create on a ClusterProviderConfig = %v, want no namespaced config given as the reason", err)
			}
			if got := e.host.volNames(); len(got) != 0 {
				t.Errorf("volumes written: %v", got)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the loopback server was connected to %d times, want 0", n)
	}
}

// TestImage_tenantServersAnswersAreNotQuoted: what a tenant's image
// server answers (a status text, a banner that is not HTTP) is not quoted
// in the error; the platform's still is. The tenant's image is on a
// public mirror (a download's guard never connects to the loopback test
// servers), reached through a forward proxy answering for it.
func TestImage_tenantServersAnswersAreNotQuoted(t *testing.T) {
	status, _ := rawServer(t, "127.0.0.1:0", "HTTP/1.1 404 SENTINEL-internal-detail\r\nContent-Length: 0\r\n\r\n")
	banner, _ := rawServer(t, "127.0.0.1:0", "SSH-2.0-SENTINEL_OpenSSH_9.6\r\n")
	for name, addr := range map[string]string{"StatusText": status, "SSHBanner": banner} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t, func(e *testEnv) {
				e.cfg.Guard = onlyAllowing(t, "127.0.0.0/8")
				e.cfg.Images["debian"] = Image{URL: mirrorURL}
			})
			e.throughProxy(addr)
			err := e.createError(e.request("web", "uid-1"))
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if strings.Contains(err.Error(), "SENTINEL") {
				t.Errorf("the error quotes the server: %v", err)
			}
			if !strings.Contains(err.Error(), "not shown to tenants") || !strings.Contains(err.Error(), "image debian") {
				t.Errorf("Create = %v, want it to name the image and say the answer is not shown", err)
			}
		})
	}
	// A proxy's own image URL on a ClusterProviderConfig is a tenant's
	// too, and the message says so without naming a namespaced config.
	e := newTestEnv(t, func(e *testEnv) { e.cfg.URLGuard = onlyAllowing(t, "127.0.0.0/8") })
	e.throughProxy(status)
	req := e.request("web", "uid-1")
	req.Placement.Image = mirrorURL
	if err := e.createError(req); err == nil || strings.Contains(err.Error(), "SENTINEL") ||
		!strings.Contains(err.Error(), "404 (its status text is not shown to tenants)") || strings.Contains(err.Error(), "namespaced") {
		t.Errorf("Create of a proxy's image URL on a ClusterProviderConfig = %v, want the status code, no status text and no namespaced config", err)
	}
	// The platform's own config keeps the server's words.
	e = newTestEnv(t, func(e *testEnv) { e.cfg.Images["debian"] = Image{URL: "http://" + status + "/debian.qcow2"} })
	if err := e.createError(e.request("web", "uid-1")); err == nil || !strings.Contains(err.Error(), "SENTINEL-internal-detail") {
		t.Errorf("Create on a platform config = %v, want the server's status text", err)
	}
}

// TestImage_failedRedirectNamesNotItsTarget: a tenant's download that
// fails after its server redirected it (a dial to where it led refused,
// a lookup that failed, a timeout) says it failed after a redirect from
// that server and nothing of where the redirect led, and is retried; one
// that fails without a redirect names its own URL's failure as before.
func TestImage_failedRedirectNamesNotItsTarget(t *testing.T) {
	asked, _ := url.Parse("http://mirror.example:8080/debian.qcow2")
	target := "http://sentinel-target.example:1/SENTINEL-path?sig=SENTINEL"
	for name, cause := range map[string]error{
		"DialRefused": &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(198, 51, 100, 9), Port: 1}, Err: errors.New("connect: connection refused")},
		"Lookup":      &net.DNSError{Err: "no such host", Name: "sentinel-target.example", IsNotFound: true},
		"Timeout":     context.DeadlineExceeded,
	} {
		t.Run(name, func(t *testing.T) {
			err := quietDownloadError(&url.Error{Op: "Get", URL: target, Err: cause}, asked)
			if msg := err.Error(); strings.Contains(msg, "SENTINEL") || strings.Contains(msg, "sentinel") || strings.Contains(msg, "198.51.100.9") || !strings.Contains(msg, "a redirect from mirror.example:8080") {
				t.Errorf("quietDownloadError = %q, want a failure after a redirect from the tenant's server, naming nothing of its target", msg)
			}
			if !errors.Is(err, cause) {
				t.Errorf("quietDownloadError = %v does not unwrap to its cause", err)
			}
		})
	}
	own := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 10), Port: 8080}, Err: errors.New("connect: connection refused")}
	if err := quietDownloadError(&url.Error{Op: "Get", URL: asked.String(), Err: own}, asked); strings.Contains(err.Error(), "redirect") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("quietDownloadError of the URL's own dial = %q, want its dial error", err)
	}
}
