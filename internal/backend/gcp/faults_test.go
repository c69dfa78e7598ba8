package gcp_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// The fault-injection suite of the GCP backend (docs/troubleshooting.md
// has its table): every fault ends in the right class and recovers once
// it clears, with one instance and nothing leaked.

// reconciler drives one resource as the managed reconciler does
// (proxytest.Reconcile): Get (Ref.Deleting once deleted), Create when it
// is missing, Delete while it is found after the resource was deleted. With amnesiac, every reconcile
// runs on a new driver with the status lost (a provider restarted each
// time, its status writes lost).
type reconciler struct {
	f        *fixture
	drv      *gcp.Driver
	req      proxy.Request
	status   proxy.Instance
	deleted  bool
	amnesiac bool
}

func (r *reconciler) reconcile(ctx context.Context) (bool, error) {
	if r.amnesiac {
		r.drv, r.status = r.f.newDriver(), proxy.Instance{}
	}
	ref := proxy.Ref{ID: r.status.ID, Name: r.req.Name, Mark: r.req.Mark, Placement: r.req.Placement, Operation: r.status.Operation,
		Live: r.deleted, Deleting: r.deleted}
	return proxytest.Reconcile(ctx, r.drv, ref, r.req, &r.status, r.deleted)
}

// converge reconciles until the goal, finishing the fake's operations
// between reconciles, and returns the errors met.
func (r *reconciler) converge(t *testing.T, what string) []error {
	t.Helper()
	var errs []error
	for range 30 {
		done, err := r.reconcile(context.Background())
		if err != nil {
			errs = append(errs, err)
		}
		if done {
			return errs
		}
		r.f.srv.SettleAll()
	}
	t.Fatalf("%s did not converge; errors: %v", what, errs)
	return nil
}

// fullProxy is a request with every piece: a firewall rule and a static
// address besides the instance.
func fullProxy() proxy.Request {
	req := request("pt-faults", "0c8f6a1e-7777-4e2a-9c3f-00000000000a")
	req.Extension = gcp.Exposure{AddressType: gcp.AddressStatic, ManageFirewall: true}
	return req
}

func wantPieces(t *testing.T, f *fixture, where string, want ...string) {
	t.Helper()
	if diff := cmp.Diff(want, f.srv.Names()); diff != "" {
		t.Errorf("%s: pieces on the project (-want +got):\n%s", where, diff)
	}
}

// TestFaults_crashAtEveryCreateStep cuts the connection of each write a
// proxy's creation makes, before the fake acts on it and after (the
// provider died or lost the answer), every reconcile on a restarted
// provider that lost its status. Resumed, the proxy ends Running with one
// instance, one rule and one address, and its deletion leaves nothing;
// deleted right after the cut instead, whatever the Create had made
// before its instance appeared is removed too. (A cut read is retried by
// the HTTP client itself, or read again by the next reconcile.)
func TestFaults_crashAtEveryCreateStep(t *testing.T) {
	golden := newFixture(t)
	req := fullProxy()
	(&reconciler{f: golden, drv: golden.driver, req: req}).converge(t, "the golden create")
	var writes []string
	for _, q := range golden.srv.Requests() {
		if !strings.HasPrefix(q, "GET ") {
			writes = append(writes, q)
		}
	}
	if len(writes) != 3 {
		t.Fatalf("the golden create made writes %v; want the rule, the address and the instance", writes)
	}
	isWrite := func(method, _ string) bool { return method != http.MethodGet }
	all := []string{"address " + testRegion + "/" + req.Name, "firewall " + req.Name, "instance " + testZone + "/" + req.Name}
	sawPartial := false
	for k, w := range writes {
		for _, after := range []bool{false, true} {
			for _, resume := range []bool{true, false} {
				w, _, _ = strings.Cut(w, "?")
				name := fmt.Sprintf("%d-%s-after=%t-resume=%t", k+1, strings.ReplaceAll(w, "/", "_"), after, resume)
				t.Run(name, func(t *testing.T) {
					f := newFixture(t)
					f.srv.CutAt(k+1, after, isWrite)
					r := &reconciler{f: f, drv: f.driver, req: req, amnesiac: true}
					if resume {
						errs := r.converge(t, "the create")
						if len(errs) == 0 {
							t.Error("no reconcile saw the cut connection")
						}
						for _, err := range errs {
							if !proxy.IsTransient(err) || !strings.Contains(err.Error(), testProvider) {
								t.Errorf("the cut connection reads %s %v; want Transient naming the provider", proxy.ClassOf(err), err)
							}
						}
						wantPieces(t, f, "resumed", all...)
					} else {
						// The reconcile that met the cut, and the one after.
						for range 2 {
							_, _ = r.reconcile(context.Background())
							f.srv.SettleAll()
						}
						left := f.srv.Names()
						if len(left) > 0 && !strings.HasPrefix(left[len(left)-1], "instance ") {
							sawPartial = true
						}
					}
					r.deleted = true
					r.converge(t, "the deletion")
					wantPieces(t, f, "deleted")
				})
			}
		}
	}
	if !sawPartial {
		t.Error("no cut left a rule or an address without an instance: the deletions prove nothing")
	}
}

// TestFaults_partialCreateIsDeleted: a rule and an address whose instance
// never appeared (its insert refused for quota) are found by name and
// mark when the resource is deleted, reported while they remain, and
// removed; the deletion then ends.
func TestFaults_partialCreateIsDeleted(t *testing.T) {
	f := newFixture(t)
	f.srv.AutoComplete(1)
	req := fullProxy()
	r := &reconciler{f: f, drv: f.driver, req: req}
	f.srv.FailNext("POST", "/instances", http.StatusForbidden, "quotaExceeded", "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1.")
	var quota error
	for range 5 {
		f.srv.SettleAll()
		if _, err := r.reconcile(context.Background()); err != nil {
			quota = err
			break
		}
	}
	if !proxy.IsQuota(quota) {
		t.Fatalf("the refused insert = %v; want Quota", quota)
	}
	wantPieces(t, f, "after the refused insert", "address "+testRegion+"/"+req.Name, "firewall "+req.Name)
	r.deleted, r.status = true, proxy.Instance{} // no instance was ever recorded
	ref := proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement, Live: true, Deleting: true}
	got, err := f.driver.Get(context.Background(), ref)
	if err != nil || got.State != proxy.StateStopped || !strings.Contains(got.Progress, "remains") || got.Mark != req.Mark {
		t.Fatalf("Get of the deleted resource = %+v, %v; want Stopped, naming what remains, with the resource's mark", got, err)
	}
	r.converge(t, "the deletion")
	wantPieces(t, f, "deleted")
	// Without Deleting (a resource that is not being deleted) they are
	// not an instance: Create picks them up again.
	f2 := newFixture(t)
	f2.srv.PutFirewall(map[string]any{"name": req.Name, "network": "global/networks/default", "description": "", "sourceRanges": []any{"10.0.0.0/8"}})
	if _, err := f2.driver.Get(context.Background(), proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement}); !proxy.IsNotFound(err) {
		t.Errorf("Get of a live resource with only a rule = %v; want NotFound", err)
	}
}

// TestFaults_table injects each fault for a while into a proxy's
// creation, checks the class it reads as, clears it, and checks that the
// proxy then comes up once, with nothing duplicated.
func TestFaults_table(t *testing.T) {
	cases := []struct {
		name   string
		inject func(f *fixture)
		class  proxy.Class
		text   string
	}{
		{"StormOf503", func(f *fixture) { f.srv.SetBusy(true) }, proxy.ClassTransient, "Backend Error"},
		{"StormOf429", func(f *fixture) {
			f.srv.SetRetryAfter("120")
			for range 20 {
				f.srv.FailNext("GET", "", http.StatusTooManyRequests, "rateLimitExceeded", "Rate Limit Exceeded")
			}
		}, proxy.ClassQuota, "rateLimitExceeded"},
		{"QuotaOnInsert", func(f *fixture) {
			f.srv.FailNext("POST", "/instances", http.StatusForbidden, "quotaExceeded", "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1.")
		}, proxy.ClassQuota, "quotaExceeded"},
		{"QuotaInTheOperation", func(f *fixture) {
			f.srv.FailNextOperation("instances", "insert", "QUOTA_EXCEEDED", "Quota 'IN_USE_ADDRESSES' exceeded.  Limit: 8.0 in region europe-west1.", 0)
		}, proxy.ClassQuota, "QUOTA_EXCEEDED"},
		{"StockoutInTheOperation", func(f *fixture) {
			f.srv.FailNextOperation("instances", "insert", "ZONE_RESOURCE_POOL_EXHAUSTED", "The zone does not have enough resources available to fulfill the request.", 503)
		}, proxy.ClassQuota, "ZONE_RESOURCE_POOL_EXHAUSTED"},
		{"ConnectionCut", func(f *fixture) { f.srv.CutAt(1, false, nil) }, proxy.ClassTransient, testProvider},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A failed operation is reported for a minute, then dropped
			// so that Create runs again: the clock moves on once seen.
			var now atomic.Int64
			now.Store(time.Now().UnixNano())
			f := newFixture(t, func(o *gcp.Options) { o.Now = func() time.Time { return time.Unix(0, now.Load()) } })
			req := fullProxy()
			r := &reconciler{f: f, drv: f.driver, req: req}
			tc.inject(f)
			var seen error
			for range 6 {
				if _, err := r.reconcile(context.Background()); err != nil {
					seen = err
					break
				}
				f.srv.SettleAll()
			}
			if seen == nil || proxy.ClassOf(seen) != tc.class || !strings.Contains(seen.Error(), tc.text) {
				t.Fatalf("under the fault: %s %v; want %s naming %q", proxy.ClassOf(seen), seen, tc.class, tc.text)
			}
			if want := map[string]time.Duration{"StormOf429": 2 * time.Minute}[tc.name]; proxy.RetryAfterOf(seen) != want {
				t.Errorf("under the fault: Retry-After read as %v; want %v", proxy.RetryAfterOf(seen), want)
			}
			f.srv.SetRetryAfter("")
			f.srv.SetBusy(false)
			f.srv.ClearFailures()
			now.Add(int64(2 * time.Minute))
			r.converge(t, "the create once the fault cleared")
			wantPieces(t, f, "recovered", "address "+testRegion+"/"+req.Name, "firewall "+req.Name, "instance "+testZone+"/"+req.Name)
			inserts := 0
			for _, q := range f.srv.Requests() {
				if strings.HasPrefix(q, "POST zones/"+testZone+"/instances") {
					inserts++
				}
			}
			if inserts > 2 {
				t.Errorf("%d instance inserts; want at most one refused and one accepted", inserts)
			}
			r.deleted = true
			r.converge(t, "the deletion")
			wantPieces(t, f, "deleted")
		})
	}
}

// TestFaults_heldDeletionIsNeverNotFound: an instance someone else is
// deleting (its delete operation held) is never NotFound to the
// resource, which waits; once the deletion ends the proxy is created
// again, once.
func TestFaults_heldDeletionIsNeverNotFound(t *testing.T) {
	f := newFixture(t)
	req := request("pt-held", "0c8f6a1e-8888-4e2a-9c3f-00000000000a")
	r := &reconciler{f: f, drv: f.driver, req: req}
	r.converge(t, "the create")
	release := f.srv.HoldDelete(testZone + "/" + req.Name)
	for i := range 3 {
		_, err := r.reconcile(context.Background())
		if err != nil {
			t.Fatalf("reconcile %d while the instance is being deleted: %v", i, err)
		}
		if r.status.ID == "" || r.status.State == proxy.StateRunning {
			t.Fatalf("reconcile %d while the instance is being deleted: %+v; want it found, not Running", i, r.status)
		}
	}
	release()
	r.converge(t, "the create after the deletion")
	wantPieces(t, f, "recreated", "instance "+testZone+"/"+req.Name)
}

// TestFaults_ruleOfAnEarlierAttemptGoesWhenNoLongerManaged: a Create
// whose insert was refused left its firewall rule; the resource then
// turns firewall.manage off before its instance exists. The Create that
// makes the instance removes the rule, as an Update would: the proxy
// comes up without a rule the spec no longer asks for.
func TestFaults_ruleOfAnEarlierAttemptGoesWhenNoLongerManaged(t *testing.T) {
	f := newFixture(t)
	f.srv.AutoComplete(1)
	req := fullProxy()
	r := &reconciler{f: f, drv: f.driver, req: req}
	f.srv.FailNext("POST", "/instances", http.StatusForbidden, "quotaExceeded", "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1.")
	var quota error
	for range 5 {
		f.srv.SettleAll()
		if _, err := r.reconcile(context.Background()); err != nil {
			quota = err
			break
		}
	}
	if !proxy.IsQuota(quota) {
		t.Fatalf("the refused insert = %v; want Quota", quota)
	}
	wantPieces(t, f, "after the refused insert", "address "+testRegion+"/"+req.Name, "firewall "+req.Name)
	r.req.Extension = gcp.Exposure{AddressType: gcp.AddressStatic}
	r.converge(t, "the create without a managed rule")
	wantPieces(t, f, "created", "address "+testRegion+"/"+req.Name, "instance "+testZone+"/"+req.Name)
}
