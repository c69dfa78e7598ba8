// Package otlptest is where tests collect the spans the provider makes:
// an OTLP/gRPC trace receiver, a real collector endpoint on loopback that
// the provider's exporter (telemetry.SetupTracing,
// OTEL_EXPORTER_OTLP_PROTOCOL=grpc) sends to and that keeps every span it
// is sent (Start), and, for a unit test, a recorder of the spans ended in
// the test's own process (Record).
package otlptest

import (
	"context"
	"encoding/hex"
	"net"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Receiver is a running OTLP/gRPC trace receiver.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	// Endpoint is its address, host:port on 127.0.0.1.
	Endpoint string

	mu    sync.Mutex
	spans []*tracepb.Span
}

// Start starts a receiver on loopback, stopped when t ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Endpoint: l.Addr().String()}
	s := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(s, r)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return r
}

// Export implements the OTLP trace service.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// Span is a received span, its IDs in hex.
type Span struct {
	Name, TraceID, SpanID, ParentID string
	Attributes                      map[string]string
}

// Spans returns every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Span, 0, len(r.spans))
	for _, s := range r.spans {
		sp := Span{Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
			ParentID: hex.EncodeToString(s.GetParentSpanId()), Attributes: map[string]string{}}
		for _, a := range s.GetAttributes() {
			v := a.GetValue()
			switch {
			case v.GetStringValue() != "":
				sp.Attributes[a.GetKey()] = v.GetStringValue()
			default:
				sp.Attributes[a.GetKey()] = v.String()
			}
		}
		out = append(out, sp)
	}
	return out
}

// Record makes the global tracer provider (otel.Tracer) one that records
// every span ended, until t ends, when the previous provider is restored,
// and returns the recorder. Tests that use it do not run in parallel.
func Record(t testing.TB) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	return rec
}
