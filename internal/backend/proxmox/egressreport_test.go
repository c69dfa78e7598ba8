package proxmox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestGuestReportsItsEgressCheck: a guest the provider's probe cannot
// reach checks its egress address through its own real Squid (the
// fake's guest runs squid.ReportScript with the request its seed's
// user-data writes) and keeps the line where the driver reads it through
// the guest agent (agent/file-read, checked against PVE's schema). The
// proxy converges on that word, Reported with the address the echo saw;
// a check the guest's Squid answered otherwise (the echo down) keeps it
// reachable and says why it failed. What a guest may write instead is not
// published, nor quoted.
func TestGuestReportsItsEgressCheck(t *testing.T) {
	port := testenv.FreePort(t)
	f := newFixture(t, withFake(func(o *pvetest.Options) {
		o.Listen, o.Squid, o.ProxyPort = true, providerenv.RequireSquid(t), int(port)
	}))
	f.fake.BlockProbes(true)
	upstream, _ := testenv.Upstream(t)
	ctx := context.Background()
	req := f.request("pt-report", "6b7c8d9e-3333-4a5e-9d55-0a9c1f1e2b3c")
	req.Proxy.Port = port
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: testenv.EchoURL(upstream), Username: squid.CheckUsername, Password: "sentinel-check-pw"}
	r := &reconciler{t: t, f: f, drv: f.drv, req: req}
	deadline := time.Now().Add(time.Minute)
	for {
		done, _ := r.reconcile(ctx)
		if done && r.status.EgressSource == proxy.EgressReported {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no report within a minute: %s %q reachable %v egress %q %q", r.status.State, r.status.Progress, r.status.ProxyReachable, r.status.EgressIP, r.status.EgressSource)
		}
		f.fake.FinishTasks()
		time.Sleep(200 * time.Millisecond)
	}
	seen := testenv.EchoFromHere(t, testenv.EchoURL(upstream))
	got := r.status
	if got.EgressIP != seen || got.ProxyAddress != "" || got.EgressCheckedAt.IsZero() || got.EgressCheckedAt.After(time.Now()) {
		t.Errorf("Get = egress %q at %v, address %q; want %s (what the echo saw), no address", got.EgressIP, got.EgressCheckedAt, got.ProxyAddress, seen)
	}
	vm := vmNamed(t, f.fake, req.Name)
	if cloudinit.EgressRequestOf(vm.Seed.UserData) == "" {
		t.Error("the seed's user-data has no egress check")
	}
	ref := proxy.Ref{ID: got.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement}
	f.fake.SetGuestFile(vm.VMID, cloudinit.ReportPath, fmt.Sprintf("%s %d 502 sentinel-guest-text\n", squid.ReportMarker, time.Now().Unix()))
	failed, err := f.drv.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if !failed.ProxyReachable || failed.EgressSource == proxy.EgressReported || failed.EgressFailure != "the check through the instance's own Squid was answered 502" {
		t.Errorf("Get after a check answered 502 = reachable %v, egress %q %q, failure %q; want reachable on the guest's word, the failure, no address",
			failed.ProxyReachable, failed.EgressIP, failed.EgressSource, failed.EgressFailure)
	}
	for name, line := range map[string]string{
		"NotAnAddress": fmt.Sprintf("%s %d 200 sentinel-guest-text\n", squid.ReportMarker, time.Now().Unix()),
		"Failed":       fmt.Sprintf("%s %d 000 \n", squid.ReportMarker, time.Now().Unix()),
		"Stale":        squid.ReportMarker + " 1000 200 198.51.100.4\n",
		"TooLong":      strings.Repeat("x", squid.MaxReport+1),
	} {
		f.fake.SetGuestFile(vm.VMID, cloudinit.ReportPath, line)
		got, err := f.drv.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if got.EgressSource == proxy.EgressReported || got.ProxyReachable {
			t.Errorf("%s: reachable %v, egress %q %q; want nothing of the guest's word", name, got.ProxyReachable, got.EgressIP, got.EgressSource)
		}
	}
	if strings.Contains(f.logs.String(), "sentinel-guest-text") || strings.Contains(f.logs.String(), "sentinel-check-pw") {
		t.Error("the log quotes the guest's report or the check's password")
	}
	if v := f.fake.Violations(); len(v) > 0 {
		t.Errorf("schema violations: %v", v)
	}
}

// TestGetDatesTheVMsLastStart: Get says when the VM last started (from
// its uptime), so that a guest's report from before it (an update's
// reboot, the report file outliving it) is not read as the word of the
// settings the VM now runs; and that reachability rests on the report.
func TestGetDatesTheVMsLastStart(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	req := f.request("pt-started", "6b7c8d9e-4444-4a5e-9d55-0a9c1f1e2b3c")
	before := time.Now()
	inst, err := f.rec.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.settle(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement}
	got, err := f.drv.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.StartedAt.Before(before.Add(-time.Second)) || got.StartedAt.After(after.Add(time.Second)) {
		t.Errorf("StartedAt %v; want the VM's start, between %v and %v (uptimes are whole seconds)", got.StartedAt, before, after)
	}

	f.fake.BlockProbes(true)
	vm := vmNamed(t, f.fake, req.Name)
	for name, tc := range map[string]struct {
		at       time.Time
		predates bool
	}{
		"FromBeforeTheStart": {at: got.StartedAt.Add(-30 * time.Second), predates: true},
		"FromThisStart":      {at: time.Now()},
	} {
		f.fake.SetGuestFile(vm.VMID, cloudinit.ReportPath, fmt.Sprintf("%s %d 200 203.0.113.3\n", squid.ReportMarker, tc.at.Unix()))
		r, err := f.drv.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if !r.ProxyReachable || !r.ReachableOnReport || r.EgressSource != proxy.EgressReported || r.ReportPredatesStart(r.EgressCheckedAt) != tc.predates {
			t.Errorf("%s: reachable %v (on the report: %v), egress %q %q at %v, started %v; want reachable on the report, predating the start: %v",
				name, r.ProxyReachable, r.ReachableOnReport, r.EgressIP, r.EgressSource, r.EgressCheckedAt, r.StartedAt, tc.predates)
		}
	}
}
