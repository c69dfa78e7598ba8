package proxy

import (
	"context"
	"errors"
	"testing"
)

// TestRun: a done ctx sends nothing, a NotFound from a step of Create is
// Permanent (only there), also when only the driver's rules make it
// NotFound, and every error leaves through the driver's wrap.
func TestRun(t *testing.T) {
	t.Parallel()
	gone := errors.New("404 gone")
	wrap := func(err error, op string) error {
		if errors.Is(err, gone) {
			err = Classify(ClassNotFound, err)
		}
		return WithContext(err, "p", op)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name      string
		ctx       context.Context
		op        string
		err       error
		wantCalls int
		wantClass Class
	}{
		{"done ctx calls nothing", done, OpGet, nil, 0, ClassTransient},
		{"success", context.Background(), OpGet, nil, 1, ""},
		{"NotFound in Get stays", context.Background(), OpGet, NotFoundf("x"), 1, ClassNotFound},
		{"NotFound in Create is Permanent", context.Background(), OpCreate, NotFoundf("x"), 1, ClassPermanent},
		{"backend's NotFound in Get stays", context.Background(), OpGet, gone, 1, ClassNotFound},
		{"backend's NotFound in Create is Permanent", context.Background(), OpCreate, gone, 1, ClassPermanent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := RunErr(tc.ctx, tc.op, wrap, func(context.Context) error { calls++; return tc.err })
			if calls != tc.wantCalls || ClassOf(err) != tc.wantClass {
				t.Fatalf("RunErr = %v (%q) after %d calls; want class %q after %d", err, ClassOf(err), calls, tc.wantClass, tc.wantCalls)
			}
			var pe *Error
			if err != nil && (!errors.As(err, &pe) || pe.Provider != "p" || pe.Op != tc.op) {
				t.Errorf("RunErr = %#v; want provider p, op %s", err, tc.op)
			}
		})
	}
}

// TestClassifyWith: nil, a classified error and a done ctx never reach the
// backend's rules; what the rules leave unclassified is Transient.
func TestClassifyWith(t *testing.T) {
	t.Parallel()
	quota := Quotaf("full")
	rules := func(err error) error {
		if err.Error() == "refused" {
			return Classify(ClassPermanent, err)
		}
		return err
	}
	for _, tc := range []struct {
		err  error
		want Class
	}{
		{nil, ""},
		{quota, ClassQuota},
		{context.Canceled, ClassTransient},
		{context.DeadlineExceeded, ClassTransient},
		{errors.New("refused"), ClassPermanent},
		{errors.New("other"), ClassTransient},
	} {
		got := ClassifyWith(tc.err, rules)
		if ClassOf(got) != tc.want || (tc.err != nil && !errors.Is(got, tc.err)) {
			t.Errorf("ClassifyWith(%v) = %v (%q); want class %q around it", tc.err, got, ClassOf(got), tc.want)
		}
	}
}

// TestRunList: List without an installation ID is Permanent and lists
// nothing.
func TestRunList(t *testing.T) {
	t.Parallel()
	called := false
	_, err := RunList(context.Background(), "", func(err error, op string) error { return WithContext(err, "p", op) },
		func(context.Context, string) ([]Instance, error) { called = true; return nil, nil })
	if !IsPermanent(err) || called {
		t.Fatalf("RunList(\"\") = %v, listed %v; want Permanent, nothing listed", err, called)
	}
}
