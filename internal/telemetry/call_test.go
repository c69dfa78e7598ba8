package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/egressproxy/provider-egressproxy/internal/telemetry/otlptest"
)

// TestTransport: a request through the decorator is one client span, a
// child of the caller's, one V(1) log line carrying that span's trace and
// span IDs, and one observation of BackendRequests; the request's
// headers, query and body (where a token or a password would be) appear
// in none of them.
func TestTransport(t *testing.T) {
	const sentinel = "sentinel-9f3c1d"
	rec := otlptest.Record(t)

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) }))
	defer srv.Close()
	var logs strings.Builder
	log := funcr.New(func(p, a string) { logs.WriteString(p + " " + a + "\n") }, funcr.Options{Verbosity: 1})
	rt := Transport("test", func(*http.Request) string { return "things.get" }, func(ctx context.Context) logr.Logger { return Logger(ctx, log) }, nil)

	ctx, parent := otel.Tracer("t").Start(context.Background(), "egressproxy.Observe")
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/things/x?token="+sentinel, strings.NewReader(sentinel))
	req.Header.Set("Authorization", "Bearer "+sentinel)
	before := testutil.CollectAndCount(BackendRequests)
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	parent.End()

	var call sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "test.things.get" {
			call = s
		}
	}
	if call == nil {
		t.Fatalf("no span test.things.get among %d", len(rec.Ended()))
	}
	if call.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("the call's span is not a child of the operation's")
	}
	attrs := map[string]string{}
	for _, a := range call.Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	if attrs["http.response.status_code"] != "404" || attrs["error.type"] != "not_found" {
		t.Errorf("span attributes %v; want status 404 and error.type not_found", attrs)
	}
	line := logs.String()
	if !strings.Contains(line, `"msg"="test api call"`) && !strings.Contains(line, "test api call") {
		t.Errorf("no log line: %q", line)
	}
	for _, want := range []string{`"trace_id"="` + call.SpanContext().TraceID().String() + `"`, `"span_id"="` + call.SpanContext().SpanID().String() + `"`, `"call"="things.get"`, `"httpStatus"="404"`} {
		if !strings.Contains(line, want) {
			t.Errorf("log line lacks %s: %s", want, line)
		}
	}
	if strings.Contains(line, sentinel) || strings.Contains(strings.Join(values(attrs), " "), sentinel) {
		t.Errorf("the request's secret is in the log line or the span")
	}
	if n := testutil.CollectAndCount(BackendRequests) - before; n != 1 {
		t.Errorf("%d new BackendRequests series; want 1", n)
	}
}

func values(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func TestLoggerWithoutSpan(t *testing.T) {
	var logs strings.Builder
	log := funcr.New(func(p, a string) { logs.WriteString(a) }, funcr.Options{})
	Logger(context.Background(), log).Info("x")
	if strings.Contains(logs.String(), "trace_id") {
		t.Errorf("a line outside any span carries a trace_id: %s", logs.String())
	}
}
