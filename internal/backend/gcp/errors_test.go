package gcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/api/googleapi"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func gErr(code int, reasons ...string) error {
	e := &googleapi.Error{Code: code, Message: fmt.Sprintf("HTTP %d", code)}
	for _, r := range reasons {
		e.Errors = append(e.Errors, googleapi.ErrorItem{Reason: r, Message: r})
	}
	return e
}

func TestClassify(t *testing.T) {
	cases := []struct {
		name       string
		err        error
		want       proxy.Class
		wantReason string
	}{
		{"404 is NotFound", gErr(404, "notFound"), proxy.ClassNotFound, "notFound"},
		{"429 is Quota", gErr(429, "rateLimitExceeded"), proxy.ClassQuota, "rateLimitExceeded"},
		{"403 quotaExceeded is Quota", gErr(403, "quotaExceeded"), proxy.ClassQuota, "quotaExceeded"},
		{"403 rateLimitExceeded is Quota", gErr(403, "rateLimitExceeded"), proxy.ClassQuota, "rateLimitExceeded"},
		{"403 userRateLimitExceeded is Quota", gErr(403, "userRateLimitExceeded"), proxy.ClassQuota, "userRateLimitExceeded"},
		{"403 forbidden is Permanent", gErr(403, "forbidden"), proxy.ClassPermanent, "forbidden"},
		{"403 accessNotConfigured is Permanent", gErr(403, "accessNotConfigured"), proxy.ClassPermanent, "accessNotConfigured"},
		{"401 is Permanent", gErr(401, "authError"), proxy.ClassPermanent, "authError"},
		{"400 is Permanent", gErr(400, "invalid"), proxy.ClassPermanent, "invalid"},
		{"409 is Transient", gErr(409, "alreadyExists"), proxy.ClassTransient, "alreadyExists"},
		{"412 is Transient", gErr(412, "conditionNotMet"), proxy.ClassTransient, "conditionNotMet"},
		{"500 is Transient", gErr(500, "backendError"), proxy.ClassTransient, "backendError"},
		{"503 is Transient", gErr(503, "backendError"), proxy.ClassTransient, "backendError"},
		{"wrapped googleapi error", fmt.Errorf("reading: %w", gErr(403, "quotaExceeded")), proxy.ClassQuota, "quotaExceeded"},
		{"network error is Transient", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, proxy.ClassTransient, ""},
		{"cancelled ctx is Transient", context.Canceled, proxy.ClassTransient, ""},
		{"deadline is Transient", fmt.Errorf("get: %w", context.DeadlineExceeded), proxy.ClassTransient, ""},
		{"classified stays", proxy.Permanentf("bad"), proxy.ClassPermanent, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := classify(tc.err)
			if c := proxy.ClassOf(got); c != tc.want {
				t.Errorf("class = %s, want %s (%v)", c, tc.want, got)
			}
			var pe *proxy.Error
			if errors.As(got, &pe) && pe.Reason != tc.wantReason {
				t.Errorf("reason = %q, want %q", pe.Reason, tc.wantReason)
			}
		})
	}
}

func failedOp(codes []string, httpStatus int32) *computeapi.Operation {
	op := &computeapi.Operation{
		Name: ptr("operation-1"), Status: ptr(computeapi.OperationDone), OperationType: ptr("insert"),
		TargetLink: ptr("https://www.googleapis.com/compute/v1/projects/p/zones/z/instances/pt"),
		EndTime:    ptr(time.Now().Format(time.RFC3339Nano)),
		Error:      &computeapi.Error{},
	}
	for _, c := range codes {
		op.Error.Errors = append(op.Error.Errors, &computeapi.Errors{Code: ptr(c), Message: ptr("because " + c)})
	}
	if httpStatus != 0 {
		op.HttpErrorStatusCode = ptr(httpStatus)
	}
	return op
}

func TestClassifyOperation(t *testing.T) {
	cases := []struct {
		name   string
		codes  []string
		status int32
		want   proxy.Class
	}{
		{"quota", []string{"QUOTA_EXCEEDED"}, 403, proxy.ClassQuota},
		{"stockout", []string{"ZONE_RESOURCE_POOL_EXHAUSTED"}, 503, proxy.ClassQuota},
		{"stockout with details", []string{"ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}, 503, proxy.ClassQuota},
		{"429 without a known code", []string{"SOMETHING"}, 429, proxy.ClassQuota},
		{"bad image is Permanent, not NotFound", []string{"RESOURCE_NOT_FOUND"}, 404, proxy.ClassPermanent},
		{"in use", []string{"RESOURCE_IN_USE_BY_ANOTHER_RESOURCE"}, 400, proxy.ClassPermanent},
		{"no HTTP status", []string{"INVALID_FIELD_VALUE"}, 0, proxy.ClassPermanent},
		{"internal error is Transient", []string{"INTERNAL_ERROR"}, 500, proxy.ClassTransient},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			oe := operationError("zones/z/operations/operation-1", failedOp(tc.codes, tc.status))
			if oe == nil {
				t.Fatal("operationError = nil for a failed operation")
			}
			err := classifyOperation(oe)
			if c := proxy.ClassOf(err); c != tc.want {
				t.Errorf("class = %s, want %s", c, tc.want)
			}
			var pe *proxy.Error
			if !errors.As(err, &pe) || pe.Reason != tc.codes[0] {
				t.Errorf("reason = %v, want GCP's code %q", pe, tc.codes[0])
			}
		})
	}
	if operationError("x", &computeapi.Operation{Status: ptr("RUNNING")}) != nil {
		t.Error("a running operation has an error")
	}
	if operationError("x", &computeapi.Operation{Status: ptr(computeapi.OperationDone)}) != nil {
		t.Error("a successful operation has an error")
	}
	if oe := operationError("x", failedOp([]string{"RESOURCE_ALREADY_EXISTS"}, 409)); oe == nil || !oe.alreadyExists() {
		t.Error("RESOURCE_ALREADY_EXISTS alone is not recognised")
	}
}

func TestMapState(t *testing.T) {
	cases := []struct {
		status, ip string
		want       proxy.State
	}{
		{"PROVISIONING", "", proxy.StateProvisioning},
		{"STAGING", "1.2.3.4", proxy.StateProvisioning},
		{"REPAIRING", "1.2.3.4", proxy.StateProvisioning},
		{"RUNNING", "", proxy.StateProvisioning},
		{"RUNNING", "1.2.3.4", proxy.StateRunning},
		{"STOPPING", "1.2.3.4", proxy.StateStopped},
		{"STOPPED", "", proxy.StateStopped},
		{"SUSPENDING", "", proxy.StateStopped},
		{"SUSPENDED", "", proxy.StateStopped},
		{"TERMINATED", "1.2.3.4", proxy.StateStopped},
		{"SOMETHING_NEW", "1.2.3.4", proxy.StateStopped},
	}
	for _, tc := range cases {
		if got := mapState(tc.status, tc.ip); got != tc.want {
			t.Errorf("mapState(%q, %q) = %s, want %s", tc.status, tc.ip, got, tc.want)
		}
	}
}

func TestOpRefs(t *testing.T) {
	for _, s := range []string{"zones/europe-west1-b/operations/operation-1", "regions/europe-west1/operations/op-2", "global/operations/op-3"} {
		o, ok := parseOpRef(s)
		if !ok || o.String() != s {
			t.Errorf("parseOpRef(%q) = %+v, %v; String %q", s, o, ok, o.String())
		}
	}
	for _, s := range []string{"", "operation-1", "zones/z/instances/x", "global/operations/", "zones//operations/x"} {
		if _, ok := parseOpRef(s); ok {
			t.Errorf("parseOpRef(%q) accepted", s)
		}
	}
	ops := splitOps("zones/z/operations/a junk global/operations/b")
	if joinOps(ops) != "zones/z/operations/a global/operations/b" {
		t.Errorf("splitOps/joinOps = %q", joinOps(ops))
	}
}
