package kvm

import (
	"context"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestGet_unmarkedImportServesWithAnySquid: a domain made by hand (no
// ownership mark), whose Squid calls itself by its own name, is reachable
// for the Observe-only import that reads it, and says what it answered
// as; the resource's own domain answering with that name is not.
func TestGet_unmarkedImportServesWithAnySquid(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	c := e.host.conn()
	dom, err := c.DomainDefineXML(ctx, "<domain type='kvm'><name>handmade</name></domain>")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DomainCreate(ctx, libvirt.Domain{Name: dom.Name}); err != nil {
		t.Fatal(err)
	}
	if !e.host.boot("handmade", 3128) {
		t.Fatal("the hand-made domain did not boot")
	}
	// The import's ref: its resource's mark, read live (the domain is not
	// the driver's own).
	imp := proxy.Ref{Name: "handmade", Mark: proxy.Mark{UID: "uid-import", InstallationID: testInstallation}, Placement: proxy.Placement{Location: "lab"}, Live: true}
	got := e.mustGet(imp)
	e.host.mu.Lock()
	e.host.squid = map[string]string{got.IP + ":3128": "squid-handmade"}
	e.host.mu.Unlock()
	got = e.mustGet(imp)
	if got.Mark != (proxy.Mark{}) || got.State != proxy.StateRunning || !got.ProxyReachable {
		t.Fatalf("hand-made domain answering as squid-handmade: %+v; want unmarked, running and reachable", got)
	}
	if a := got.Details[squid.DetailAnswer]; a != `answered as "squid-handmade"` {
		t.Errorf("Details[%s] = %q; want the name it answered as", squid.DetailAnswer, a)
	}

	// The resource's own domain, answering with the same name, stays as
	// strict as ever.
	inst := createAndBootNot(t, e, "web")
	e.host.boot("web", 3128)
	own := e.mustGet(ref(inst))
	e.host.mu.Lock()
	e.host.squid[own.IP+":3128"] = "squid-handmade"
	e.host.mu.Unlock()
	own = e.mustGet(ref(inst))
	if own.ProxyReachable || !strings.Contains(own.Progress, "not one of the provider's") || strings.Contains(own.Progress, "squid-handmade") {
		t.Errorf("own domain answering as squid-handmade: %t %q; want not reachable, the name not quoted", own.ProxyReachable, own.Progress)
	}
	if _, ok := own.Details[squid.DetailAnswer]; ok {
		t.Errorf("own domain's Details hold an answer: %v", own.Details)
	}
}
