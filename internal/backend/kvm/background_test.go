package kvm

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// reconcileContext is ctx as controller-runtime hands it to a reconcile:
// its logger in the context (no Options.Log), inside an operation's span.
func (e *testEnv) reconcileContext(logs *testenv.Buffer, op string) (context.Context, trace.Span) {
	l := funcr.New(func(prefix, args string) { logs.Line(prefix + " " + args) }, funcr.Options{Verbosity: 2})
	return e.b.tracer.Start(logr.NewContext(context.Background(), l), op)
}

// below reports whether span s is (a descendant of) the span parent.
func below(spans []sdktrace.ReadOnlySpan, s sdktrace.ReadOnlySpan, parent trace.SpanContext) bool {
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, x := range spans {
		byID[x.SpanContext().SpanID()] = x
	}
	for p := s.Parent(); p.IsValid(); {
		if p.SpanID() == parent.SpanID() {
			return true
		}
		x, ok := byID[p.SpanID()]
		if !ok {
			return false
		}
		p = x.Parent()
	}
	return false
}

func spansNamed(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// TestBackground_visibleInTheCreatesTraceAndLog: the image download and
// the rest of the create, which run after Create returned, log through
// the logger of the create's context (the reconcile's: no Options.Log),
// every line with provider, host and name and the create's trace, and
// their spans are below the create's span; a second create that joins
// the download links to it.
func TestBackground_visibleInTheCreatesTraceAndLog(t *testing.T) {
	e := newTestEnv(t)
	e.b.logOpt = nil
	release := e.images.holdBodies()
	var logs, logs2 testenv.Buffer

	ctx, op := e.reconcileContext(&logs, "test.Create")
	if _, err := e.d.Create(ctx, e.request("egp-bg-1", "uid-bg-1")); err != nil {
		t.Fatalf("Create: %v", err)
	}
	op.End()
	ctx2, op2 := e.reconcileContext(&logs2, "test.Create")
	if _, err := e.d.Create(ctx2, e.request("egp-bg-2", "uid-bg-2")); err != nil {
		t.Fatalf("second Create: %v", err)
	}
	op2.End()
	release()
	e.waitBackgroundDone()

	spans := e.spans.Ended()
	fetch := spansNamed(spans, spanFetch)
	if len(fetch) != 1 || fetch[0].Parent().SpanID() != op.SpanContext().SpanID() {
		t.Fatalf("%d %s spans; want one, a child of the first create's", len(fetch), spanFetch)
	}
	for _, name := range []string{spanDownload, spanPrefix + "StorageVolUpload", spanPrefix + "StoragePoolRefresh"} {
		s := spansNamed(spans, name)
		if len(s) == 0 || !below(spans, s[0], fetch[0].SpanContext()) {
			t.Errorf("no span %s below %s", name, spanFetch)
		}
	}
	finish := spansNamed(spans, spanFinish)
	if len(finish) != 2 {
		t.Fatalf("%d %s spans; want 2", len(finish), spanFinish)
	}
	for _, f := range finish {
		var mine trace.SpanContext
		switch f.Parent().SpanID() {
		case op.SpanContext().SpanID():
			mine = op.SpanContext()
		case op2.SpanContext().SpanID():
			mine = op2.SpanContext()
			if len(f.Links()) != 1 || f.Links()[0].SpanContext.SpanID() != fetch[0].SpanContext().SpanID() {
				t.Errorf("the second create's %s links %v; want the download's span", spanFinish, f.Links())
			}
		default:
			t.Fatalf("%s is a child of neither create's span", spanFinish)
		}
		var defined bool
		for _, s := range spans {
			if s.Name() == spanPrefix+"DomainDefineXML" && below(spans, s, f.SpanContext()) {
				defined = s.Parent().TraceID() == mine.TraceID()
			}
		}
		if !defined {
			t.Errorf("no DomainDefineXML below the %s of trace %s", spanFinish, mine.TraceID())
		}
	}
	for _, s := range spans {
		if s.Name() == "test.Create" && s.SpanContext().SpanID() == op2.SpanContext().SpanID() {
			if len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != fetch[0].SpanContext().SpanID() {
				t.Errorf("the joining create's span links %v; want the download's span", s.Links())
			}
		}
	}

	// Every line the background work wrote is in the create's log, with
	// the create's trace and the instance it is about.
	for _, tc := range []struct {
		logs  *testenv.Buffer
		name  string
		trace trace.TraceID
		want  []string
	}{
		{&logs, "egp-bg-1", op.SpanContext().TraceID(), []string{"kvm image download finished", "kvm domain defined and started", `"rpc"="StorageVolUpload"`}},
		{&logs2, "egp-bg-2", op2.SpanContext().TraceID(), []string{"kvm domain defined and started", `"rpc"="DomainDefineXML"`}},
	} {
		text := tc.logs.String()
		for _, w := range tc.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: no line %q in the create's log:\n%s", tc.name, w, text)
			}
		}
		for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
			for _, w := range []string{`"provider"="` + testProvider + `"`, `"host"="lab"`, `"name"="` + tc.name + `"`, `"trace_id"="` + tc.trace.String() + `"`} {
				if !strings.Contains(line, w) {
					t.Errorf("%s: line lacks %s: %s", tc.name, w, line)
				}
			}
		}
	}
}

// TestBackground_failureIsLoggedThroughTheReconcilesLogger: a download
// that fails in the background is logged at info by the logger of the
// create's context, with the instance and the create's trace.
func TestBackground_failureIsLoggedThroughTheReconcilesLogger(t *testing.T) {
	e := newTestEnv(t)
	e.b.logOpt = nil
	e.images.status = http.StatusInternalServerError
	var logs testenv.Buffer
	ctx, op := e.reconcileContext(&logs, "test.Create")
	_, err := e.d.Create(ctx, e.request("egp-bg-fail", "uid-bg-fail"))
	op.End()
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	e.waitBackgroundDone()
	var found bool
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "kvm background create failed") {
			found = true
			for _, w := range []string{`"level"=0`, `"provider"="` + testProvider + `"`, `"host"="lab"`, `"name"="egp-bg-fail"`,
				`"trace_id"="` + op.SpanContext().TraceID().String() + `"`, "the server answered 500"} {
				if !strings.Contains(line, w) {
					t.Errorf("the failure line lacks %s: %s", w, line)
				}
			}
		}
	}
	if !found {
		t.Errorf("no line kvm background create failed in the create's log:\n%s", logs.String())
	}
	finish := spansNamed(e.spans.Ended(), spanFinish)
	if len(finish) != 1 || finish[0].Status().Description == "" {
		t.Errorf("%s spans %d; want one with an error status", spanFinish, len(finish))
	}
}
