package gcp_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func refOf(inst proxy.Instance, req proxy.Request) proxy.Ref {
	return proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement, Operation: inst.Operation}
}

// observe is what the controller does on each poll: Get with the status
// of the last one.
func observe(t *testing.T, d *gcp.Driver, ref *proxy.Ref) (proxy.Instance, error) {
	t.Helper()
	inst, err := d.Get(context.Background(), *ref)
	if err == nil {
		ref.ID, ref.Operation = inst.ID, inst.Operation
	}
	return inst, err
}

func TestStaticAddressAndFirewallAreCreatedAndRemoved(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	req := request("pt-static", "0c8f6a1e-1111-4e2a-9c3f-00000000000a")
	req.Extension = gcp.Exposure{AddressType: gcp.AddressStatic, ManageFirewall: true}

	// 1: the rule and the reservation are submitted; the instance waits
	// for the address.
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if inst.State != proxy.StateProvisioning || !strings.Contains(inst.Progress, "reserving static address") || len(strings.Fields(inst.Operation)) != 2 {
		t.Fatalf("first Create = %+v; want Provisioning, reserving, two operations", inst)
	}
	if _, ok := f.srv.Instance(testZone, req.Name); ok {
		t.Fatal("the instance was inserted before its address was reserved")
	}
	ref := refOf(inst, req)
	if got, err := observe(t, f.driver, &ref); err != nil || got.State != proxy.StateProvisioning {
		t.Fatalf("Get while reserving = %+v, %v; want Provisioning (never NotFound)", got, err)
	}
	f.srv.SettleAll()
	if _, err := observe(t, f.driver, &ref); !proxy.IsNotFound(err) {
		t.Fatalf("Get once reserved, before the instance = %v; want NotFound so that Create continues", err)
	}

	// 2: the instance, with the reserved address as its NAT IP.
	if inst, err = f.driver.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	f.srv.SettleAll()
	a, _ := f.srv.Address(testRegion, req.Name)
	ip, _ := a["address"].(string)
	ref = refOf(inst, req)
	got, err := observe(t, f.driver, &ref)
	if err != nil || got.State != proxy.StateRunning || got.IP != ip || got.EgressIP != ip || !got.ProxyReachable {
		t.Fatalf("Get after boot = %+v, %v; want Running at the static address %s", got, err, ip)
	}
	fw, ok := f.srv.Firewall(req.Name)
	// The rule targets the proxy's own tag: the provider's prefix and a
	// digest, never its name (which could be http-server, a tag the
	// default network's rules open to everyone).
	tag := gcp.ProxyTag(req)
	if !strings.HasPrefix(tag, gcp.TagPrefix) || strings.Contains(tag, req.Name) {
		t.Errorf("ProxyTag = %q; want %s and a digest", tag, gcp.TagPrefix)
	}
	if !ok || fmt.Sprint(fw["sourceRanges"]) != "[10.0.0.0/8]" || fmt.Sprint(fw["targetTags"]) != "["+tag+"]" || fw["disabled"] != false {
		t.Fatalf("firewall rule = %v", fw)
	}
	if in, _ := f.srv.Instance(testZone, req.Name); !strings.Contains(fmt.Sprint(in["tags"]), tag) {
		t.Errorf("instance tags %v; want %s on it", in["tags"], tag)
	}
	if labels := a["labels"].(map[string]any); labels["egressproxy-uid"] != req.Mark.UID || labels["egressproxy-retain"] != "false" { //nolint:forcetypeassert // JSON.
		t.Errorf("address labels %v", labels)
	}

	// Delete: instance, then address, then rule; the proxy is reported
	// until the last is gone.
	steps := 0
	for ; steps < 10; steps++ {
		if err := f.driver.Delete(ctx, ref); err != nil {
			t.Fatalf("Delete step %d: %v", steps, err)
		}
		f.srv.SettleAll()
		got, err := observe(t, f.driver, &ref)
		if proxy.IsNotFound(err) {
			break
		}
		if err != nil || got.State != proxy.StateStopped || !strings.Contains(got.Progress, "delet") {
			t.Fatalf("Get while deleting (step %d) = %+v, %v; want Stopped, deleting", steps, got, err)
		}
	}
	if left := f.srv.Names(); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	var deletes []string
	for _, r := range f.srv.Requests() {
		if strings.HasPrefix(r, "DELETE ") {
			deletes = append(deletes, strings.Split(r, "/")[len(strings.Split(r, "/"))-2])
		}
	}
	if !slices.Equal(deletes, []string{"instances", "addresses", "firewalls"}) {
		t.Errorf("deletions %v; want instances, addresses, firewalls, once each", deletes)
	}
	// Compact answers, as Google's own clients ask for them.
	for _, r := range f.srv.Requests() {
		_, query, _ := strings.Cut(r, "?")
		if q, _ := url.ParseQuery(query); q.Get("prettyPrint") != "false" {
			t.Errorf("%s: not prettyPrint=false", r)
		}
	}
}

func TestRetainedAddressOutlivesTheProxy(t *testing.T) {
	f := newFixture(t)
	f.srv.AutoComplete(time.Millisecond)
	ctx := context.Background()
	req := request("pt-retain", "0c8f6a1e-2222-4e2a-9c3f-00000000000a")
	req.Extension = gcp.Exposure{AddressType: gcp.AddressStatic, RetainAddress: true}
	var inst proxy.Instance
	var err error
	for range 3 {
		if inst, err = f.driver.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ref := refOf(inst, req)
	for range 5 {
		if err := f.driver.Delete(ctx, ref); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		if _, err := observe(t, f.driver, &ref); proxy.IsNotFound(err) {
			break
		}
	}
	if _, err := f.driver.Get(ctx, ref); !proxy.IsNotFound(err) {
		t.Fatalf("Get after deleting = %v; want NotFound (a retained address does not hold the proxy)", err)
	}
	if _, ok := f.srv.Address(testRegion, req.Name); !ok {
		t.Error("the retained address was released")
	}
}

func TestInternalAddressOnly(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	req := request("pt-internal", "0c8f6a1e-3333-4e2a-9c3f-00000000000a")
	req.Extension = gcp.Exposure{AddressType: gcp.AddressInternal}
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.SettleAll()
	got, err := f.driver.Get(ctx, refOf(inst, req))
	if err != nil {
		t.Fatal(err)
	}
	if got.State != proxy.StateRunning || got.IP == "" || got.IP != got.Details["networkIP"] || got.EgressIP != "" {
		t.Errorf("internal proxy = %+v; want Running at its internal address, no egress IP known", got)
	}
	body, _ := f.srv.Instance(testZone, req.Name)
	if strings.Contains(fmt.Sprint(body["networkInterfaces"]), "accessConfigs") {
		t.Errorf("an internal proxy has an access config: %v", body["networkInterfaces"])
	}
}

// TestOperationFailureIsReportedThenRetried: an insert accepted and
// failed later is reported with GCP's code while held, then dropped so
// that Create runs again.
func TestOperationFailureIsReportedThenRetried(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	f := newFixture(t, func(o *gcp.Options) {
		o.FailedOperationHold = time.Minute
		o.Now = func() time.Time { return time.Unix(0, now.Load()) }
	})
	ctx := context.Background()
	req := request("pt-stockout", "0c8f6a1e-4444-4e2a-9c3f-00000000000a")
	f.srv.FailNextOperation("instances", "insert", "ZONE_RESOURCE_POOL_EXHAUSTED", "The zone 'projects/p/zones/europe-west1-b' does not have enough resources available to fulfill the request.", 503)
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// As the controller: the operation was not written into status (the
	// runtime drops Create's status), so the driver remembers it.
	ref := proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement, ID: inst.ID}
	if got, err := observe(t, f.driver, &ref); err != nil || got.State != proxy.StateProvisioning || got.Operation == "" {
		t.Fatalf("Get while the insert runs = %+v, %v; want Provisioning with the operation to keep in status", got, err)
	}
	f.srv.SettleAll()
	for i := range 2 {
		_, err := observe(t, f.driver, &ref)
		if !proxy.IsQuota(err) || !strings.Contains(err.Error(), "ZONE_RESOURCE_POOL_EXHAUSTED") || !strings.Contains(err.Error(), testProvider) {
			t.Fatalf("Get #%d after the operation failed = %v; want Quota with GCP's code and the provider", i, err)
		}
	}
	now.Add(int64(2 * time.Minute))
	if _, err := observe(t, f.driver, &ref); !proxy.IsNotFound(err) {
		t.Fatalf("Get past the hold = %v; want NotFound, so that Create runs again", err)
	}
	if _, err := f.driver.Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	f.srv.SettleAll()
	if got, err := f.driver.Get(ctx, proxy.Ref{Name: req.Name, Placement: req.Placement}); err != nil || got.State != proxy.StateRunning {
		t.Errorf("Get after the retry = %+v, %v", got, err)
	}
}

func TestSynchronousErrorsAreClassified(t *testing.T) {
	cases := []struct {
		status int
		reason string
		check  func(error) bool
	}{
		{403, "quotaExceeded", proxy.IsQuota},
		{429, "rateLimitExceeded", proxy.IsQuota},
		{403, "rateLimitExceeded", proxy.IsQuota},
		{403, "forbidden", proxy.IsPermanent},
		{400, "invalid", proxy.IsPermanent},
		{401, "authError", proxy.IsPermanent},
		{500, "backendError", proxy.IsTransient},
		// A 404 to the insert names its image, network or zone: Create is
		// never NotFound (the controller would read it as "create again").
		{404, "notFound", proxy.IsPermanent},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%d %s", tc.status, tc.reason), func(t *testing.T) {
			f := newFixture(t)
			f.srv.FailNext("POST", "/instances", tc.status, tc.reason, "refused: "+tc.reason)
			_, err := f.driver.Create(context.Background(), request("pt-sync", "0c8f6a1e-5555-4e2a-9c3f-00000000000a"))
			if !tc.check(err) || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Create = %s %v", proxy.ClassOf(err), err)
			}
		})
	}
	t.Run("409 on a duplicate insert adopts our own instance", func(t *testing.T) {
		f := newFixture(t)
		req := request("pt-dup", "0c8f6a1e-5555-4e2a-9c3f-00000000000b")
		if _, err := f.driver.Create(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		// Make the next read miss it, as a read racing the insert would.
		f.srv.FailNext("GET", "/instances/pt-dup", 404, "notFound", "The resource was not found")
		got, err := f.driver.Create(context.Background(), req)
		if err != nil || got.Mark != req.Mark {
			t.Errorf("Create racing its own insert = %+v, %v; want our instance", got, err)
		}
		if n := len(slices.DeleteFunc(f.srv.Requests(), func(r string) bool { return !strings.HasPrefix(r, "POST zones/") })); n != 2 {
			t.Errorf("%d inserts; want 2 (the second answered 409)", n)
		}
	})
}

func TestListFailsWholeWhenAZoneIsUnreachable(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.driver.Create(ctx, request("pt-list", "0c8f6a1e-6666-4e2a-9c3f-00000000000a")); err != nil {
		t.Fatal(err)
	}
	l, err := f.driver.List(ctx, testInstallation)
	if err != nil || len(l) != 1 {
		t.Fatalf("List = %v, %v", l, err)
	}
	if !slices.ContainsFunc(f.srv.Requests(), func(r string) bool {
		return strings.HasPrefix(r, "GET aggregated/instances?") && strings.Contains(r, "returnPartialSuccess=true") && strings.Contains(r, "egressproxy-installation")
	}) {
		t.Errorf("List did not filter on the installation label with partial success: %v", f.srv.Requests())
	}
	f.srv.SetUnreachable("zones/us-central1-a")
	if _, err := f.driver.List(ctx, testInstallation); !proxy.IsTransient(err) || !strings.Contains(err.Error(), "us-central1-a") {
		t.Errorf("List with an unreachable zone = %v; want Transient naming it", err)
	}
}

func TestCheck(t *testing.T) {
	f := newFixture(t)
	f.srv.SetQuotas(testRegion, []gcptest.Quota{{Metric: "CPUS", Limit: 24, Usage: 22}, {Metric: "IN_USE_ADDRESSES", Limit: 8, Usage: 8}, {Metric: "NETWORKS", Limit: 5, Usage: 1}})
	h := f.driver.Check(context.Background())
	if !h.Healthy() || len(h.Targets) != 1 {
		t.Fatalf("Check = %+v", h)
	}
	tg := h.Targets[0]
	if tg.Target != "projects/"+testProject || tg.Details["quota.europe-west1.CPUS"] != "22/24" || tg.Details["quota.europe-west1.IN_USE_ADDRESSES"] != "8/8" {
		t.Errorf("target %+v; want the project with quota headroom", tg)
	}
	if _, ok := tg.Details["quota.europe-west1.NETWORKS"]; ok {
		t.Error("a quota a proxy does not use is reported")
	}
	if r := f.srv.Requests(); len(r) != 2 || !strings.HasPrefix(r[0], "GET aggregated/instances?maxResults=1") || r[1] != "GET regions/europe-west1?prettyPrint=false" {
		t.Errorf("Check made %v; want one list page with maxResults=1 and the region", r)
	}

	cases := []struct {
		name   string
		poke   func(s *gcptest.Server)
		ctx    func() context.Context
		reason string
	}{
		{"Forbidden", func(s *gcptest.Server) {
			s.FailNext("GET", "aggregated", 403, "forbidden", "Required 'compute.instances.list' permission")
		}, nil, proxy.ReasonForbidden},
		{"Unauthorized", func(s *gcptest.Server) { s.FailNext("GET", "aggregated", 401, "authError", "Invalid Credentials") }, nil, proxy.ReasonUnauthorized},
		{"QuotaExceeded", func(s *gcptest.Server) {
			s.FailNext("GET", "aggregated", 403, "rateLimitExceeded", "Rate Limit Exceeded")
		}, nil, gcp.ReasonQuotaExceeded},
		{"APIError", func(s *gcptest.Server) { s.SetBusy(true) }, nil, proxy.ReasonAPIError},
		{"Timeout", func(*gcptest.Server) {}, func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, proxy.ReasonTimeout},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.poke(f.srv)
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx()
			}
			h := f.driver.Check(ctx)
			if h.Healthy() || h.Targets[0].Reason != tc.reason || h.Targets[0].Message == "" {
				t.Errorf("Check = %+v; want unhealthy, %s", h.Targets, tc.reason)
			}
		})
	}
}

// TestFirewallNeverOpensToEveryone is the attack of a proxy whose clients
// are all IPv6 (or whose CIDRs leave no IPv4 source): a firewall rule
// without source ranges would admit 0.0.0.0/0, so none is written, on
// Create or on Update.
func TestFirewallNeverOpensToEveryone(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	req := request("pt-v6only", "0c8f6a1e-1111-4e2a-9c3f-00000000000b")
	req.Proxy.AllowedClientCIDRs = []string{"2001:db8::/32"}
	req.Extension = gcp.Exposure{AddressType: gcp.AddressEphemeral, ManageFirewall: true}
	if _, err := f.driver.Create(ctx, req); !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "allowedClientCIDRs holds no IPv4 CIDR") || !strings.Contains(err.Error(), "firewall.manage: false") {
		t.Fatalf("Create = %v; want a Permanent error asking for an IPv4 client CIDR", err)
	}
	if _, err := f.driver.Update(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement}, req); err == nil {
		t.Fatal("Update with no IPv4 client CIDR succeeded")
	}
	if fw, ok := f.srv.Firewall(req.Name); ok {
		t.Fatalf("a firewall rule was written: %v", fw)
	}
}
