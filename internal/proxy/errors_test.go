package proxy

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestWithContext(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                 string
		err                  error
		op                   string
		wantMsg              string
		wantClass            Class
		wantProvider, wantOp string
		// keepsOriginal: the original error is still in the chain (it is
		// copied, not wrapped, when it is itself an *Error).
		keepsOriginal bool
	}{
		{
			name:    "unclassified becomes transient",
			err:     errors.New("boom"),
			wantMsg: "p: get: boom", keepsOriginal: true,
			wantClass:    ClassTransient,
			wantProvider: "p", wantOp: "get",
		},
		{
			name:    "cancelled context is transient",
			err:     context.Canceled,
			wantMsg: "p: get: context canceled", keepsOriginal: true,
			wantClass:    ClassTransient,
			wantProvider: "p", wantOp: "get",
		},
		{
			name:         "classified gets provider and op",
			err:          NotFoundf("no domain %q", "a"),
			wantMsg:      `p: get: no domain "a"`,
			wantClass:    ClassNotFound,
			wantProvider: "p", wantOp: "get",
		},
		{
			name:    "existing provider and op are kept",
			err:     &Error{Class: ClassQuota, Provider: "q", Op: "create", Err: errors.New("full")},
			wantMsg: "q: create: full", keepsOriginal: true,
			wantClass:    ClassQuota,
			wantProvider: "q", wantOp: "create",
		},
		{
			name:    "wrapping text around a classified error is kept",
			err:     fmt.Errorf("deleting disk vol-1: %w", NotFoundf("no such volume")),
			op:      "delete",
			wantMsg: "p: delete: deleting disk vol-1: no such volume", keepsOriginal: true,
			wantClass:    ClassNotFound,
			wantProvider: "p", wantOp: "delete",
		},
		{
			name:         "an *Error without class becomes transient",
			err:          &Error{Err: errors.New("odd")},
			wantMsg:      "p: get: odd",
			wantClass:    ClassTransient,
			wantProvider: "p", wantOp: "get",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			op := tc.op
			if op == "" {
				op = "get"
			}
			got := WithContext(tc.err, "p", op)
			if got.Error() != tc.wantMsg {
				t.Errorf("Error() = %q, want %q", got.Error(), tc.wantMsg)
			}
			if c := ClassOf(got); c != tc.wantClass {
				t.Errorf("ClassOf = %q, want %q", c, tc.wantClass)
			}
			var pe *Error
			if !errors.As(got, &pe) {
				t.Fatalf("not an *Error: %T", got)
			}
			if pe.Provider != tc.wantProvider || pe.Op != tc.wantOp {
				t.Errorf("Provider, Op = %q, %q, want %q, %q", pe.Provider, pe.Op, tc.wantProvider, tc.wantOp)
			}
			if tc.keepsOriginal && !errors.Is(got, tc.err) {
				t.Errorf("errors.Is(result, original) = false")
			}
		})
	}
	if WithContext(nil, "p", "get") != nil {
		t.Error("WithContext(nil) != nil")
	}
}

func TestMissingOnCreateIsPermanent(t *testing.T) {
	missing := MissingOnCreate(WithContext(NotFoundf("template 9000 does not exist"), "pve", "create"))
	const want = "pve: create: something the proxy needs does not exist: template 9000 does not exist"
	if !IsPermanent(missing) || missing.Error() != want {
		t.Errorf("MissingOnCreate(NotFound) = %s %q; want Permanent %q", ClassOf(missing), missing, want)
	}
	for _, err := range []error{nil, Transientf("busy"), Quotaf("no room"), Permanentf("bad")} {
		if got := MissingOnCreate(err); got != err { //nolint:errorlint // Identity: other classes pass through untouched.
			t.Errorf("MissingOnCreate(%v) = %v; want it unchanged", err, got)
		}
	}
}

// TestUnresolvedSurvivesWithContext: the driver's wrapping keeps what the
// controller reads; no other error reads as Unresolved.
func TestUnresolvedSurvivesWithContext(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		Unresolvedf("no zone"),
		WithContext(Unresolvedf("no zone"), "gcp", "get"),
		WithContext(fmt.Errorf("resolving: %w", Unresolvedf("no zone")), "gcp", "delete"),
	} {
		if !IsUnresolved(err) || !IsPermanent(err) {
			t.Errorf("IsUnresolved(%q) = %v, class %s; want true, Permanent", err, IsUnresolved(err), ClassOf(err))
		}
	}
	for _, err := range []error{nil, Permanentf("bad"), NotFoundf("gone"), errors.New("plain"), &Error{Class: ClassTransient, Reason: ReasonUnresolved}} {
		if IsUnresolved(err) {
			t.Errorf("IsUnresolved(%v) = true; want false", err)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              0,
		"120":                           2 * time.Minute,
		"-5":                            0,
		"86400":                         time.Hour, // capped
		"Tue, 01 Dec 2026 12:03:00 GMT": 3 * time.Minute,
		"Tue, 01 Dec 2026 11:00:00 GMT": 0, // past
		"soon":                          0,
	} {
		h := make(map[string][]string)
		if v != "" {
			h["Retry-After"] = []string{v}
		}
		if got := ParseRetryAfter(h, now); got != want {
			t.Errorf("ParseRetryAfter(%q) = %v; want %v", v, got, want)
		}
	}
}

// TestRetryAfterOfSurvivesWithContext: the backend's wait is kept when the
// driver names its provider and operation, wrapped or not.
func TestRetryAfterOfSurvivesWithContext(t *testing.T) {
	e := &Error{Class: ClassTransient, RetryAfter: time.Minute, Err: errors.New("429")}
	for _, err := range []error{e, WithContext(e, "p", "get"), WithContext(fmt.Errorf("reading: %w", e), "p", "get")} {
		if got := RetryAfterOf(err); got != time.Minute {
			t.Errorf("RetryAfterOf(%v) = %v; want 1m", err, got)
		}
	}
	if got := RetryAfterOf(Transientf("busy")); got != 0 {
		t.Errorf("RetryAfterOf without one = %v", got)
	}
}
