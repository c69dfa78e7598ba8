package kvm

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// unreachedGuest is a running guest with an egress check whose Squid the
// provider's probe finds nothing of, and write, which puts line in its
// report file.
func unreachedGuest(t *testing.T, mutate ...func(*testEnv)) (e *testEnv, inst proxy.Instance, write func(line string)) {
	t.Helper()
	e = newTestEnv(t, mutate...)
	req := e.request("web", "uid-web")
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo.example/ip", Username: squid.CheckUsername, Password: "sentinel-check-pw"}
	inst = e.mustCreate(req)
	e.waitBackground()
	e.host.boot("web", 3128)
	e.host.mu.Lock()
	e.host.squid = map[string]string{} // the provider's probe finds nothing
	e.host.mu.Unlock()
	if p, err := e.d.plan(context.Background(), req); err != nil || cloudinit.EgressRequestOf(p.userData) == "" {
		t.Fatalf("the seed's user-data has no egress check (%v)", err)
	}
	return e, inst, func(line string) {
		e.host.mu.Lock()
		e.host.guestFiles[cloudinit.ReportPath] = base64.StdEncoding.EncodeToString([]byte(line))
		e.host.mu.Unlock()
	}
}

// TestGet_readsTheGuestsOwnEgressCheck: a guest whose Squid the provider
// cannot reach has its own check's line read through the guest agent
// (guest-file-open/read/close of cloudinit.ReportPath); a valid address
// makes it reachable and Reported, a check its Squid answered otherwise
// (the echo down) reachable and why the check failed. What else a guest
// may write is not published, nor quoted; a reachable guest is not asked.
func TestGet_readsTheGuestsOwnEgressCheck(t *testing.T) {
	e, inst, write := unreachedGuest(t)
	if got := e.mustGet(ref(inst)); got.ProxyReachable || got.EgressSource != "" {
		t.Errorf("no report yet: reachable %v, egress %q %q", got.ProxyReachable, got.EgressIP, got.EgressSource)
	}
	now := time.Now().Unix()
	write(fmt.Sprintf("%s %d 200 198.51.100.4\n", squid.ReportMarker, now))
	got := e.mustGet(ref(inst))
	if !got.ProxyReachable || !got.ReachableOnReport || got.ProxyAddress != "" || got.Progress != "" || got.EgressIP != "198.51.100.4" || got.EgressSource != proxy.EgressReported || got.EgressCheckedAt.Unix() != now {
		t.Errorf("Get = reachable %v (on the report: %v), address %q, progress %q, egress %q %q at %v; want reachable on the guest's word, 198.51.100.4 Reported",
			got.ProxyReachable, got.ReachableOnReport, got.ProxyAddress, got.Progress, got.EgressIP, got.EgressSource, got.EgressCheckedAt)
	}
	write(fmt.Sprintf("%s %d 502 sentinel-guest-text\n", squid.ReportMarker, now))
	got = e.mustGet(ref(inst))
	if !got.ProxyReachable || got.Progress != "" || got.EgressSource == proxy.EgressReported || got.EgressFailure != "the check through the instance's own Squid was answered 502" {
		t.Errorf("Get after a check answered 502 = reachable %v, progress %q, egress %q %q, failure %q; want reachable on the guest's word, the failure, no address",
			got.ProxyReachable, got.Progress, got.EgressIP, got.EgressSource, got.EgressFailure)
	}
	for name, line := range map[string]string{
		"NotAnAddress": fmt.Sprintf("%s %d 200 sentinel-guest-text", squid.ReportMarker, now),
		"NoSquid":      fmt.Sprintf("%s %d 000 ", squid.ReportMarker, now),
		"Stale":        squid.ReportMarker + " 1000 200 198.51.100.4",
		"Garbage":      "sentinel-guest-text",
	} {
		write(line)
		if got := e.mustGet(ref(inst)); got.ProxyReachable || got.EgressSource != "" || got.EgressFailure != "" {
			t.Errorf("%s: reachable %v, egress %q %q, failure %q; want nothing of the guest's word", name, got.ProxyReachable, got.EgressIP, got.EgressSource, got.EgressFailure)
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

// TestGet_routedGuestsReportKeepsItsOwnAddress: on a routed host the
// guest's own address is the backend's figure of its egress address; a
// report of another, or of a failed check, leaves it in BackendEgressIP
// for the controller to compare.
func TestGet_routedGuestsReportKeepsItsOwnAddress(t *testing.T) {
	e, inst, write := unreachedGuest(t, func(e *testEnv) { e.cfg.Hosts[0].Routed = true })
	now := time.Now().Unix()
	write(fmt.Sprintf("%s %d 200 198.51.100.4\n", squid.ReportMarker, now))
	got := e.mustGet(ref(inst))
	if got.IP == "" || got.EgressIP != "198.51.100.4" || got.EgressSource != proxy.EgressReported || got.BackendEgressIP != got.IP {
		t.Errorf("Get = address %s, egress %q %q, backend's %q; want 198.51.100.4 Reported, the guest's own address the backend's", got.IP, got.EgressIP, got.EgressSource, got.BackendEgressIP)
	}
	write(fmt.Sprintf("%s %d 502 \n", squid.ReportMarker, now))
	got = e.mustGet(ref(inst))
	if !got.ProxyReachable || got.EgressIP != got.IP || got.EgressSource != proxy.EgressBackend || got.BackendEgressIP != got.IP || got.EgressFailure == "" {
		t.Errorf("Get after a failed check = reachable %v, egress %q %q, backend's %q, failure %q; want reachable, the guest's own address, Backend, and the failure",
			got.ProxyReachable, got.EgressIP, got.EgressSource, got.BackendEgressIP, got.EgressFailure)
	}
}
