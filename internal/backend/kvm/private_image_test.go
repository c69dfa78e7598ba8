package kvm

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// knownCluster are a cluster's networks, all known: the Service CIDR, the
// pod range, one node and the API server.
type knownCluster []netip.Prefix

func (n knownCluster) Networks(context.Context) []netip.Prefix { return n }

// TestImage_tenantImageOnAPrivateHostIsNotDownloaded: a namespaced config
// (the tenant's own hypervisor) names an image on a private host that is
// none of the cluster's networks (an intranet server). Create fails
// Permanent, naming the image and how the platform team would allow a
// private mirror; the server is never asked, nothing lands in the
// tenant's pool. The download is handed to the platform's forward proxy,
// a loopback stand-in for 10.50.1.1 (the target is checked before).
func TestImage_tenantImageOnAPrivateHostIsNotDownloaded(t *testing.T) {
	const secret = "SENTINEL-intranet-payroll"
	var asked atomic.Int32
	intranet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set("Content-Length", strconv.Itoa(len(secret)))
		if r.Method != http.MethodHead {
			_, _ = w.Write([]byte(secret))
		}
	}))
	t.Cleanup(intranet.Close)
	tenant := netguard.New(netguard.Options{Cluster: knownCluster{
		netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.244.0.0/16"),
		netip.MustParsePrefix("192.168.49.2/32"), netip.MustParsePrefix("10.0.1.5/32"),
	}})
	e := newTestEnv(t, func(e *testEnv) {
		e.cfg.Guard = tenant
		e.cfg.Images["debian"] = Image{URL: "http://user:pw@10.50.1.1/payroll.qcow2?sig=S3CRET"}
	})
	e.throughProxy(intranet.Listener.Addr().String())
	err := e.createError(e.request("web", "6f1c2a7e-3b4d-4c5e-9f60-718293a4b5c6"))
	if !netguard.IsRefused(err) || proxy.ClassOf(err) != proxy.ClassPermanent {
		t.Fatalf("Create = %v (%s); want a Permanent refusal", err, proxy.ClassOf(err))
	}
	for _, want := range []string{"image debian", "not a public address", "--tenant-content-allowed-cidrs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Create = %q; want it to say %q", err, want)
		}
	}
	for _, never := range []string{"S3CRET", "pw@"} {
		if strings.Contains(err.Error(), never) {
			t.Errorf("Create = %q; it quotes the URL's %q", err, never)
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the intranet server was asked %d times; want 0", n)
	}
	if got := e.host.volNames(); len(got) != 0 {
		t.Errorf("volumes written to the tenant's pool: %v", got)
	}
}
