package gcp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestGuestReportsItsEgressCheck: a proxy whose firewall keeps the
// provider's probe out (no rule admits it) is checked by its guest, on
// its real Squid, with the request its cloud-init writes; the line comes
// back through getGuestAttributes (the fake checks the call and its answer
// against Compute Engine's discovery document), and Get reports the proxy
// reachable and the address the echo saw, Reported, with the external
// address kept as the backend's figure. A check the guest's Squid
// answered otherwise (the echo down) keeps the proxy reachable and says
// why it failed. What a guest writes otherwise is not published, nor
// quoted.
func TestGuestReportsItsEgressCheck(t *testing.T) {
	f := newFixture(t)
	f.srv.RunSquid(providerenv.RequireSquid(t))
	f.srv.EnforceFirewall("127.0.0.1")
	upstream, _ := testenv.Upstream(t)
	ctx := context.Background()

	req := request("reporter", "uid-report")
	req.Proxy.Port = testenv.FreePort(t)
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: testenv.EchoURL(upstream), Username: squid.CheckUsername, Password: "sentinel-check-pw"}
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	f.srv.Settle(req.Name)
	if v := fixtureMetadataItem(f, req.Name, gcp.MetadataGuestAttributes); v != "TRUE" {
		t.Errorf("instance metadata %s = %q; want TRUE", gcp.MetadataGuestAttributes, v)
	}
	ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement}
	testenv.WaitFor(t, "the guest's report", time.Minute, func() (bool, string) {
		if inst, err = f.driver.Get(ctx, ref); err != nil {
			return false, err.Error()
		}
		return inst.EgressSource == proxy.EgressReported, fmt.Sprintf("%s %q reachable %v egress %q %q", inst.State, inst.Progress, inst.ProxyReachable, inst.EgressIP, inst.EgressSource)
	})
	seen := testenv.EchoFromHere(t, testenv.EchoURL(upstream))
	if inst.EgressIP != seen || !inst.ProxyReachable || inst.ProxyAddress != "" || inst.Progress != "" || inst.EgressCheckedAt.Before(created.Add(-time.Second)) || inst.EgressCheckedAt.After(time.Now()) {
		t.Errorf("Get = egress %q at %v, reachable %v, address %q, progress %q; want %s (what the echo saw), reachable through the guest's word, no address",
			inst.EgressIP, inst.EgressCheckedAt, inst.ProxyReachable, inst.ProxyAddress, inst.Progress, seen)
	}
	if inst.IP == "" || inst.BackendEgressIP != inst.IP {
		t.Errorf("Get = external address %q, backend's egress figure %q; want the external address kept", inst.IP, inst.BackendEgressIP)
	}
	calls := 0
	for _, r := range f.srv.Requests() {
		if strings.Contains(r, "/getGuestAttributes?") {
			calls++
			if !strings.Contains(r, "variableKey="+strings.ReplaceAll(cloudinit.GuestAttributeKey, "/", "%2F")) {
				t.Errorf("request %q does not ask for %s", r, cloudinit.GuestAttributeKey)
			}
		}
	}
	if calls == 0 {
		t.Error("no getGuestAttributes request")
	}

	key := testZone + "/" + req.Name
	f.srv.SetGuestAttribute(key, cloudinit.GuestAttributeKey, squid.ReportMarker+" "+fmt.Sprint(time.Now().Unix())+" 502 <b>sentinel-guest-text</b>")
	got, err := f.driver.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if !got.ProxyReachable || got.Progress != "" || got.EgressSource != proxy.EgressBackend || got.EgressIP != got.IP || got.EgressFailure != "the check through the instance's own Squid was answered 502" {
		t.Errorf("Get after a check answered 502 = reachable %v, progress %q, egress %q %q, failure %q; want reachable on the guest's word, the external address, the failure",
			got.ProxyReachable, got.Progress, got.EgressIP, got.EgressSource, got.EgressFailure)
	}

	// What a guest may write instead.
	for name, value := range map[string]string{
		"NotAnAddress": squid.ReportMarker + " " + fmt.Sprint(time.Now().Unix()) + " 200 <b>sentinel-guest-text</b>",
		"Failed":       squid.ReportMarker + " " + fmt.Sprint(time.Now().Unix()) + " 000 ",
		"BeforeTheVM":  squid.ReportMarker + " 1000 200 203.0.113.9",
		"TooLong":      squid.ReportMarker + " " + fmt.Sprint(time.Now().Unix()) + " 200 203.0.113.9" + strings.Repeat(" ", squid.MaxReport),
		"NotALine":     "sentinel-guest-text",
	} {
		f.srv.SetGuestAttribute(key, cloudinit.GuestAttributeKey, value)
		got, err := f.driver.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if got.EgressSource == proxy.EgressReported || got.ProxyReachable {
			t.Errorf("%s: Get = egress %q (%s), reachable %v; want nothing of the guest's word", name, got.EgressIP, got.EgressSource, got.ProxyReachable)
		}
	}
	if strings.Contains(f.logs.String(), "sentinel-guest-text") || strings.Contains(f.logs.String(), "sentinel-check-pw") {
		t.Error("the driver's log quotes the guest's attribute or the check's password")
	}
	if v := f.srv.Violations(); len(v) > 0 {
		t.Errorf("discovery document violations: %v", v)
	}
	if err := f.driver.Delete(ctx, ref); err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
}

// Without a check the instance neither enables guest attributes nor is
// asked for them.
func TestNoEgressCheckNoGuestAttributes(t *testing.T) {
	f := newFixture(t)
	f.srv.EnforceFirewall("127.0.0.1")
	ctx := context.Background()
	req := request("silent", "uid-silent")
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
	if v := fixtureMetadataItem(f, req.Name, gcp.MetadataGuestAttributes); v != "" {
		t.Errorf("instance metadata %s = %q; want none", gcp.MetadataGuestAttributes, v)
	}
	if _, err := f.driver.Get(ctx, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement}); err != nil {
		t.Fatal(err)
	}
	for _, r := range f.srv.Requests() {
		if strings.Contains(r, "getGuestAttributes") {
			t.Errorf("request %q for a proxy without a check", r)
		}
	}
}

// metadataItem is the value of the instance's metadata item key.
func fixtureMetadataItem(f *fixture, name, key string) string {
	in, _ := f.srv.Instance(testZone, name)
	md, _ := in["metadata"].(map[string]any)
	items, _ := md["items"].([]any)
	for _, it := range items {
		if m, ok := it.(map[string]any); ok && m["key"] == key {
			v, _ := m["value"].(string)
			return v
		}
	}
	return ""
}

// TestTurnedOffCheckLeavesNoReportStanding: a guest the provider cannot
// reach reported its check; once the config names no check, the update
// turns guest attributes off and Get no longer reads the old report, so a
// silent Squid reads unreachable (Ready does not rest on a stale word).
func TestTurnedOffCheckLeavesNoReportStanding(t *testing.T) {
	f := newFixture(t)
	f.srv.SetSquidDown(true)
	ctx := context.Background()
	req := request("turned-off", "uid-turned-off")
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo.example/ip", Username: squid.CheckUsername, Password: "check-pw"}
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
	ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement}
	f.srv.SetGuestAttribute(testZone+"/"+req.Name, cloudinit.GuestAttributeKey, squid.ReportMarker+" "+fmt.Sprint(time.Now().Unix())+" 200 203.0.113.3")
	got, err := f.driver.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if !got.ProxyReachable || got.EgressSource != proxy.EgressReported {
		t.Fatalf("Get with the check = reachable %v, egress %q %q; want reachable on the guest's report", got.ProxyReachable, got.EgressIP, got.EgressSource)
	}

	req.Proxy.EgressCheck = nil
	if _, err := f.driver.Update(ctx, ref, req); err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
	if v := fixtureMetadataItem(f, req.Name, gcp.MetadataGuestAttributes); v != "" {
		t.Errorf("instance metadata %s = %q after the check was turned off; want none", gcp.MetadataGuestAttributes, v)
	}
	got, err = f.driver.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.ProxyReachable || got.EgressSource == proxy.EgressReported {
		t.Errorf("Get without a check = reachable %v, egress %q %q; want unreachable, nothing reported", got.ProxyReachable, got.EgressIP, got.EgressSource)
	}
}

// TestReportOfACheckTurnedOffIsNotRead: an instance left with guest
// attributes on after its check was turned off (as an update of an older
// provider left it) still has its guest's last report; Get does not read
// it: the metadata names no check.
func TestReportOfACheckTurnedOffIsNotRead(t *testing.T) {
	f := newFixture(t)
	f.srv.SetSquidDown(true)
	ctx := context.Background()
	req := request("left-on", "uid-left-on")
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo.example/ip", Username: squid.CheckUsername, Password: "check-pw"}
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
	ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement}
	req.Proxy.EgressCheck = nil
	if _, err := f.driver.Update(ctx, ref, req); err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
	in, err := f.opts.API.GetInstance(ctx, testZone, req.Name)
	if err != nil {
		t.Fatal(err)
	}
	key, on := gcp.MetadataGuestAttributes, "TRUE"
	in.Metadata.Items = append(in.Metadata.Items, &computeapi.Items{Key: &key, Value: &on})
	if _, err := f.opts.API.UpdateInstance(ctx, testZone, in, "NO_EFFECT"); err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
	f.srv.SetGuestAttribute(testZone+"/"+req.Name, cloudinit.GuestAttributeKey, squid.ReportMarker+" "+fmt.Sprint(time.Now().Unix())+" 200 203.0.113.3")
	got, err := f.driver.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.ProxyReachable || got.EgressSource == proxy.EgressReported {
		t.Errorf("Get without a check = reachable %v, egress %q %q; want unreachable, nothing reported", got.ProxyReachable, got.EgressIP, got.EgressSource)
	}
}

// TestReportFromBeforeTheRestartIsNotRead: a changed echo URL restarts
// the VM with the new check; the guest's attribute outlives the restart,
// and the line it holds, made with the old URL, no longer counts. The
// first line of the new boot does.
func TestReportFromBeforeTheRestartIsNotRead(t *testing.T) {
	f := newFixture(t)
	f.srv.SetSquidDown(true)
	ctx := context.Background()
	req := request("new-echo", "uid-new-echo")
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo-one.example/ip", Username: squid.CheckUsername, Password: "check-pw"}
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
	key := testZone + "/" + req.Name
	f.srv.Age(key, time.Hour)
	ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement}
	report := func(at time.Time) string {
		return squid.ReportMarker + " " + fmt.Sprint(at.Unix()) + " 200 203.0.113.3"
	}
	f.srv.SetGuestAttribute(key, cloudinit.GuestAttributeKey, report(time.Now().Add(-10*time.Minute)))
	if got, err := f.driver.Get(ctx, ref); err != nil || got.EgressSource != proxy.EgressReported {
		t.Fatalf("Get with the first check = %v, egress %q; want Reported", err, got.EgressSource)
	}

	req.Proxy.EgressCheck.URL = "http://echo-two.example/ip"
	if _, err := f.driver.Update(ctx, ref, req); err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
	got, err := f.driver.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.ProxyReachable || got.EgressSource == proxy.EgressReported {
		t.Errorf("Get after the echo URL changed = reachable %v, egress %q %q; want the old report not read", got.ProxyReachable, got.EgressIP, got.EgressSource)
	}
	f.srv.SetGuestAttribute(key, cloudinit.GuestAttributeKey, report(time.Now()))
	if got, err := f.driver.Get(ctx, ref); err != nil || !got.ProxyReachable || got.EgressSource != proxy.EgressReported {
		t.Errorf("Get after the new boot's report = %v, reachable %v, egress %q; want Reported", err, got.ProxyReachable, got.EgressSource)
	}
}

// TestGetDatesTheInstancesLastStart: Get says when the instance last
// started (lastStartTimestamp), later after the restart an update of the
// check makes, and that its reachability rests on the guest's report, so
// that the controller reads no report of the settings before.
func TestGetDatesTheInstancesLastStart(t *testing.T) {
	f := newFixture(t)
	f.srv.SetSquidDown(true)
	ctx := context.Background()
	req := request("started", "uid-started")
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo-one.example/ip", Username: squid.CheckUsername, Password: "check-pw"}
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
	key := testZone + "/" + req.Name
	f.srv.Age(key, time.Hour)
	ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement}
	f.srv.SetGuestAttribute(key, cloudinit.GuestAttributeKey, squid.ReportMarker+" "+fmt.Sprint(time.Now().Unix())+" 200 203.0.113.3")
	first, err := f.driver.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if first.StartedAt.IsZero() || first.StartedAt.After(time.Now().Add(-30*time.Minute)) || !first.ReachableOnReport || first.ReportPredatesStart(first.EgressCheckedAt) {
		t.Errorf("Get = started %v, reachable on the report %v, report at %v; want the start an hour ago, reachable on a report of this start", first.StartedAt, first.ReachableOnReport, first.EgressCheckedAt)
	}

	req.Proxy.EgressCheck.URL = "http://echo-two.example/ip"
	if _, err := f.driver.Update(ctx, ref, req); err != nil {
		t.Fatal(err)
	}
	f.srv.Settle(req.Name)
	got, err := f.driver.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if !got.StartedAt.After(first.StartedAt) {
		t.Errorf("Get after the update's restart = started %v; want later than %v", got.StartedAt, first.StartedAt)
	}
}
