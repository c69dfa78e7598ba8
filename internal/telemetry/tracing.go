package telemetry

import (
	"context"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the provider's spans.
const TracerName = "github.com/egressproxy/provider-egressproxy"

// Tracer returns the provider's tracer from the global provider, which is
// a no-op until SetupTracing installs an exporter.
func Tracer() trace.Tracer { return otel.Tracer(TracerName) }

// TracingEnabled reports whether the environment asks for traces: an OTLP
// endpoint is set and OTEL_TRACES_EXPORTER is not "none".
func TracingEnabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none") || strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// SetupTracing installs an OTLP exporter configured by the standard OTEL_
// environment variables (endpoint, protocol, headers, service name) as the
// global tracer provider. Tracing is off, and nothing is installed, when no
// OTLP endpoint is set. The returned function flushes and stops it.
func SetupTracing(ctx context.Context, version string) (enabled bool, shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	if !TracingEnabled(os.Getenv) {
		return false, noop, nil
	}
	var client otlptrace.Client
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto == "grpc" {
		client = otlptracegrpc.NewClient()
	} else {
		// http/protobuf is the specification's default.
		client = otlptracehttp.NewClient()
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return false, noop, err
	}
	// resource.Default reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
	res, err := resource.Merge(
		resource.NewSchemaless(semconv.ServiceName("provider-egressproxy"), semconv.ServiceVersion(version)),
		resource.Default(),
	)
	if err != nil {
		return false, noop, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return true, tp.Shutdown, nil
}
