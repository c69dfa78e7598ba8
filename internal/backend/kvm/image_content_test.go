package kvm

import (
	"context"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// mirrorURL is a tenant's image on a public mirror: an address of
// TEST-NET-3, which the tenant guards of these tests allow for content
// (mirrorRange) so that it stands for a public one, never dialled, since
// the downloads reach it through the forward proxy of throughProxy.
const mirrorURL = "http://203.0.113.10/debian.qcow2"

// mirrorRange is mirrorURL's range, open for tenants' downloads.
var mirrorRange = netip.MustParsePrefix("203.0.113.0/24")

// throughProxy sends e's image downloads to a forward proxy at addr (the
// platform team's choice, dialled without the guard once the URL was
// checked): a loopback test server answering for the mirror, which the
// download guard of a tenant's images never connects to directly.
func (e *testEnv) throughProxy(addr string) {
	e.b.http = &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: addr})}}
}

// TestImage_allowedRangesDoNotOpenTenantDownloads: the platform team
// allows a range for tenants' endpoints (here loopback, where a tenant's
// hypervisor API could be) that the guard otherwise refuses. A tenant's
// image in that range, a namespaced config's catalogue entry or a
// proxy's own URL, is not downloaded: its bytes would go into the
// tenant's pool. The loopback server is never connected to. The same
// tenant's image on a public mirror downloads.
func TestImage_allowedRangesDoNotOpenTenantDownloads(t *testing.T) {
	inner, hits := rawServer(t, "127.0.0.1:0", "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
	guard := onlyAllowing(t, "127.0.0.0/8")
	if err := guard.Check(context.Background(), netip.MustParseAddr("127.0.0.1")); err != nil {
		t.Fatalf("the endpoints' guard refuses loopback it allows: %v", err)
	}
	for name, setup := range map[string]func(e *testEnv){
		"CatalogueImage": func(e *testEnv) {
			e.cfg.Guard = guard
			e.cfg.Images["debian"] = Image{URL: "http://" + inner + "/debian.qcow2"}
		},
		"ProxyImageURL": func(e *testEnv) { e.cfg.URLGuard = guard },
	} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t, setup)
			req := e.request("web", "uid-1")
			if name == "ProxyImageURL" {
				req.Placement.Image = "http://" + inner + "/debian.qcow2"
			}
			err := e.createError(req)
			if !netguard.IsRefused(err) || proxy.ClassOf(err) != proxy.ClassPermanent || !strings.Contains(err.Error(), "does not connect to 127.0.0.1") {
				t.Fatalf("Create = %v (%s); want a Permanent refusal of 127.0.0.1", err, proxy.ClassOf(err))
			}
			if got := e.host.volNames(); len(got) != 0 {
				t.Errorf("volumes written: %v", got)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the server in the allowed range was connected to %d times; want 0", n)
	}

	e := newTestEnv(t, func(e *testEnv) {
		e.cfg.Guard = guard
		e.cfg.Images["debian"] = Image{URL: mirrorURL, SHA256: e.images.sha()}
	})
	e.throughProxy(e.images.Listener.Addr().String())
	inst := e.mustCreate(e.request("web", "uid-1"))
	if err := e.settle(context.Background(), inst.ID); err != nil {
		t.Fatalf("a tenant's image on a public mirror: %v", err)
	}
	if e.images.gets.Load() == 0 {
		t.Fatal("the mirror's image was not downloaded")
	}
}

// TestImage_tenantErrorsDoNotQuoteTheImage: what a tenant's image server
// sent (the digest of its body, its size) is not in the errors of a
// namespaced config's download; a platform config's errors name them.
func TestImage_tenantErrorsDoNotQuoteTheImage(t *testing.T) {
	// Room for the overlay, the seed and 1 MiB; not for the 3 MiB image.
	tight := func(e *testEnv) { e.host.pools["default"].available = 10<<30 + seedReserve + 1<<20 }
	capped := func(e *testEnv) { e.cfg.MaxImageBytes = 1 << 20 }
	headLies := func(e *testEnv) { e.images.headSize = 1024 }
	size := regexp.MustCompile(`\b3 MiB|need \d+ MiB|of \d+ bytes`)
	cases := []struct {
		name  string
		setup []func(e *testEnv)
		class proxy.Class
		// tenant is in the tenant's error; platform in the platform's.
		tenant, platform string
		// quoted is what the platform's error quotes of the image.
		quoted func(e *testEnv) *regexp.Regexp
	}{
		{"Sha256Mismatch", []func(*testEnv){func(e *testEnv) {
			im := e.cfg.Images["debian"]
			im.SHA256 = strings.Repeat("ab", 32)
			e.cfg.Images["debian"] = im
		}}, proxy.ClassPermanent, "its sha256 is not the one the config says (" + strings.Repeat("ab", 32) + ")", "sha256 is ",
			func(e *testEnv) *regexp.Regexp { return regexp.MustCompile(e.images.sha()) }},
		{"LargerThanTheCap/HonestHead", []func(*testEnv){capped}, proxy.ClassPermanent,
			"is larger than the 1 MiB the config allows", "is 3 MiB, more than the 1 MiB", func(*testEnv) *regexp.Regexp { return size }},
		{"LargerThanTheCap/HeadLies", []func(*testEnv){capped, headLies}, proxy.ClassPermanent,
			"is larger than the 1 MiB the config allows", "is 3 MiB, more than the 1 MiB", func(*testEnv) *regexp.Regexp { return size }},
		{"PoolFull/HeadLies", []func(*testEnv){tight, headLies}, proxy.ClassQuota,
			"less than image debian and the proxy need", "image debian (3 MiB)", func(*testEnv) *regexp.Regexp { return size }},
	}
	for _, tc := range cases {
		for _, tenant := range []bool{true, false} {
			name := tc.name + "/platform"
			if tenant {
				name = tc.name + "/tenant"
			}
			t.Run(name, func(t *testing.T) {
				e := newTestEnv(t, append([]func(*testEnv){func(e *testEnv) {
					if tenant {
						e.cfg.Guard = onlyAllowing(t, "127.0.0.0/8")
					}
					e.cfg.Images["debian"] = Image{URL: mirrorURL, SHA256: e.images.sha()}
				}}, tc.setup...)...)
				e.throughProxy(e.images.Listener.Addr().String())
				err := e.createError(e.request("web", "uid-1"))
				if err == nil || proxy.ClassOf(err) != tc.class {
					t.Fatalf("Create = %v (%s); want %s", err, proxy.ClassOf(err), tc.class)
				}
				quoted := tc.quoted(e).MatchString(err.Error())
				want := tc.platform
				if tenant {
					want = tc.tenant
				}
				if !strings.Contains(err.Error(), want) || quoted == tenant {
					t.Errorf("Create = %v; want it to say %q, quoting the image (%v) only for the platform's config", err, want, tc.quoted(e))
				}
				if got := e.host.volNames(); len(got) != 0 {
					t.Errorf("volumes left: %v", got)
				}
			})
		}
	}
}
