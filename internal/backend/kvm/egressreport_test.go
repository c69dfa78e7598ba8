package kvm

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestGet_readsTheGuestsOwnEgressCheck: a guest whose Squid the provider
// cannot reach has its own check's line read through the guest agent
// (guest-file-open/read/close of cloudinit.ReportPath); a valid address
// makes it reachable and Reported. What else a guest may write is not
// published, nor quoted; a reachable guest is not asked.
func TestGet_readsTheGuestsOwnEgressCheck(t *testing.T) {
	e := newTestEnv(t)
	req := e.request("web", "uid-web")
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo.example/ip", Username: squid.CheckUsername, Password: "sentinel-check-pw"}
	inst := e.mustCreate(req)
	e.waitBackground()
	e.host.boot("web", 3128)
	e.host.mu.Lock()
	e.host.squid = map[string]string{} // the provider's probe finds nothing
	e.host.mu.Unlock()
	if p, err := e.d.plan(req); err != nil || cloudinit.EgressRequestOf(p.userData) == "" {
		t.Fatalf("the seed's user-data has no egress check (%v)", err)
	}
	write := func(line string) {
		e.host.mu.Lock()
		e.host.guestFiles[cloudinit.ReportPath] = base64.StdEncoding.EncodeToString([]byte(line))
		e.host.mu.Unlock()
	}
	if got := e.mustGet(ref(inst)); got.ProxyReachable || got.EgressSource != "" {
		t.Errorf("no report yet: reachable %v, egress %q %q", got.ProxyReachable, got.EgressIP, got.EgressSource)
	}
	now := time.Now().Unix()
	write(fmt.Sprintf("%s %d 200 198.51.100.4\n", squid.ReportMarker, now))
	got := e.mustGet(ref(inst))
	if !got.ProxyReachable || got.ProxyAddress != "" || got.Progress != "" || got.EgressIP != "198.51.100.4" || got.EgressSource != proxy.EgressReported || got.EgressCheckedAt.Unix() != now {
		t.Errorf("Get = reachable %v, address %q, progress %q, egress %q %q at %v; want reachable on the guest's word, 198.51.100.4 Reported",
			got.ProxyReachable, got.ProxyAddress, got.Progress, got.EgressIP, got.EgressSource, got.EgressCheckedAt)
	}
	for name, line := range map[string]string{
		"NotAnAddress": fmt.Sprintf("%s %d 200 sentinel-guest-text", squid.ReportMarker, now),
		"Failed":       fmt.Sprintf("%s %d 407 ", squid.ReportMarker, now),
		"Stale":        squid.ReportMarker + " 1000 200 198.51.100.4",
		"Garbage":      "sentinel-guest-text",
	} {
		write(line)
		if got := e.mustGet(ref(inst)); got.ProxyReachable || got.EgressSource != "" {
			t.Errorf("%s: reachable %v, egress %q %q; want nothing of the guest's word", name, got.ProxyReachable, got.EgressIP, got.EgressSource)
		}
	}
	if strings.Contains(e.logs.String(), "sentinel-guest-text") || strings.Contains(e.logs.String(), "sentinel-check-pw") {
		t.Error("the log quotes the guest's report or the check's password")
	}
	// Reachable: the provider checks itself, the guest is not asked.
	write(fmt.Sprintf("%s %d 200 198.51.100.4\n", squid.ReportMarker, now))
	e.host.mu.Lock()
	e.host.squid = map[string]string{got.IP + ":3128": squid.Identity("uid-web")}
	e.host.mu.Unlock()
	if got := e.mustGet(ref(inst)); got.EgressSource == proxy.EgressReported || got.ProxyAddress == "" {
		t.Errorf("reachable: egress %q %q, address %q; want the provider's own check", got.EgressIP, got.EgressSource, got.ProxyAddress)
	}
}
