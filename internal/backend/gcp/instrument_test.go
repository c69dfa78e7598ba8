package gcp

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/api/option"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
)

func TestComputeMethod(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{"GET", "/compute/v1/projects/p/zones/europe-west1-b/instances/team-a-x", "instances.get"},
		{"POST", "/compute/v1/projects/p/zones/europe-west1-b/instances", "instances.insert"},
		{"PUT", "/compute/v1/projects/p/zones/z/instances/x", "instances.update"},
		{"DELETE", "/compute/v1/projects/p/zones/z/instances/x", "instances.delete"},
		{"GET", "/compute/v1/projects/p/aggregated/instances", "instances.aggregatedList"},
		{"GET", "/compute/v1/projects/p/zones/z/operations/operation-1", "zoneOperations.get"},
		{"GET", "/compute/v1/projects/p/regions/r/operations/operation-1", "regionOperations.get"},
		{"GET", "/compute/v1/projects/p/global/operations/operation-1", "globalOperations.get"},
		{"POST", "/compute/v1/projects/p/regions/r/addresses/x/setLabels", "addresses.setLabels"},
		{"PATCH", "/compute/v1/projects/p/global/firewalls/x", "firewalls.patch"},
		{"GET", "/compute/v1/projects/p/regions/r", "regions.get"},
		{"GET", "/token", "other"},
	} {
		req := &http.Request{Method: tc.method, URL: &url.URL{Path: tc.path}}
		if got := computeMethod(req); got != tc.want {
			t.Errorf("computeMethod(%s %s) = %q; want %q", tc.method, tc.path, got, tc.want)
		}
	}
}

// TestEveryRequestIsAChildSpan: requests through the client are spans
// below the caller's, the aggregated listing's too.
func TestEveryRequestIsAChildSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	srv := gcptest.New(t, "egressproxy-spans")
	api, err := NewSDK(context.Background(), srv.Project, option.WithEndpoint(srv.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = api.Close() }()
	ctx, parent := tp.Tracer("t").Start(context.Background(), "egressproxy.List")
	if _, err := api.AggregatedInstances(ctx, "", 10, ""); err != nil {
		t.Fatal(err)
	}
	_, _ = api.GetInstance(ctx, "europe-west1-b", "missing")
	parent.End()
	for _, want := range []string{"gcp.instances.aggregatedList", "gcp.instances.get"} {
		found := false
		for _, s := range rec.Ended() {
			if s.Name() == want && s.Parent().SpanID() == parent.SpanContext().SpanID() {
				found = true
			}
		}
		if !found {
			var names []string
			for _, s := range rec.Ended() {
				names = append(names, s.Name())
			}
			t.Errorf("no span %s below the caller's; spans: %v", want, names)
		}
	}
}
