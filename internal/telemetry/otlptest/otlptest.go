// Package otlptest is an OTLP/gRPC trace receiver for tests: a real
// collector endpoint on loopback that the provider's exporter
// (telemetry.SetupTracing, OTEL_EXPORTER_OTLP_PROTOCOL=grpc) sends to, and
// that keeps every span it is sent.
package otlptest

import (
	"context"
	"encoding/hex"
	"net"
	"sync"
	"testing"

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
