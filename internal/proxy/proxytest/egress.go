package proxytest

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// reportedIP is the address a guest reports in EgressReport.
const reportedIP = "203.0.113.77"

// EgressReportedOnlyFromAValidLineWhenUnreached: a proxy the provider
// cannot reach, whose guest reports one address from its own egress
// check, reads as reachable, EgressSource Reported with that address and
// the report's time (never later than now), and no ProxyAddress. A line
// that is not one address is not published, and neither its text nor the
// check's password appears in an error or the log. A backend the provider
// always reaches never reports.
func checkEgressReport(e *env) {
	e.need("ReportEgress", e.f.ReportEgress != nil)
	req := e.f.Request(nameA, uidA)
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo.example.com/ip", Username: squid.CheckUsername, Password: "sentinel-check-password-" + uidA}
	inst := e.create(req)
	e.settle(inst.ID)
	ref := refTo(inst, req)
	at := time.Now().Add(-time.Second).Truncate(time.Second)
	err := e.f.ReportEgress(e.ctx, inst.ID, fmt.Sprintf("%s %d 200 %s\n", squid.ReportMarker, at.Unix(), reportedIP))
	if errors.Is(err, ErrAlwaysReached) {
		if got := e.mustGet(ref); got.EgressSource == proxy.EgressReported {
			e.t.Errorf("Get of a proxy the provider always reaches = egress %q %s; want no report read", got.EgressIP, got.EgressSource)
		}
		return
	}
	if err != nil {
		e.t.Fatalf("proxytest: ReportEgress(%q): %v", inst.ID, err)
	}
	got := e.mustGet(ref)
	if got.State != proxy.StateRunning || !got.ProxyReachable || got.ProxyAddress != "" || got.EgressIP != reportedIP ||
		got.EgressSource != proxy.EgressReported || !got.EgressCheckedAt.Equal(at) || got.EgressCheckedAt.After(time.Now()) {
		e.t.Errorf("Get after the guest reported %s at %v = %s, reachable %v, address %q, egress %q %q at %v; want Running, reachable on the guest's word, no address, %s Reported at that time",
			reportedIP, at, got.State, got.ProxyReachable, got.ProxyAddress, got.EgressIP, got.EgressSource, got.EgressCheckedAt, reportedIP)
	}

	const text = "sentinel-guest-text"
	for _, line := range []string{
		fmt.Sprintf("%s %d 200 <html>%s</html>\n", squid.ReportMarker, at.Unix(), text),
		fmt.Sprintf("%s %d 200 %s %s\n", squid.ReportMarker, at.Unix(), reportedIP, text),
		text + "\n",
	} {
		if err := e.f.ReportEgress(e.ctx, inst.ID, line); err != nil {
			e.t.Fatalf("proxytest: ReportEgress(%q): %v", inst.ID, err)
		}
		got, err := e.get(ref)
		if err != nil && strings.Contains(err.Error(), text) {
			e.t.Errorf("Get's error quotes the guest's report: %v", err)
		}
		if got.EgressSource == proxy.EgressReported || got.EgressIP == reportedIP {
			e.t.Errorf("Get after the guest reported %q = egress %q %q; want nothing published", line, got.EgressIP, got.EgressSource)
		}
	}
	if e.f.LogOutput != nil {
		if out := e.f.LogOutput(); strings.Contains(out, text) || strings.Contains(out, req.Proxy.EgressCheck.Password) {
			e.t.Errorf("the driver's log quotes the guest's report or the check's password")
		}
	}
}
