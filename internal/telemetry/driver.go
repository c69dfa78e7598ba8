package telemetry

import (
	"context"
	"net"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// ErrorClass is the error_class label of err: none for a success, else
// its class in lower snake case (not_found, transient, permanent, quota).
func ErrorClass(err error) string {
	if err == nil {
		return "none"
	}
	switch proxy.ClassOf(err) {
	case proxy.ClassNotFound:
		return "not_found"
	case proxy.ClassPermanent:
		return "permanent"
	case proxy.ClassQuota:
		return "quota"
	default:
		return "transient"
	}
}

// ServerAttributes are OpenTelemetry's server.address and server.port of
// a host:port (or of a host alone).
func ServerAttributes(hostport string) []attribute.KeyValue {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return []attribute.KeyValue{semconv.ServerAddress(hostport)}
	}
	attrs := []attribute.KeyValue{semconv.ServerAddress(host)}
	if p, err := strconv.Atoi(port); err == nil {
		attrs = append(attrs, semconv.ServerPort(p))
	}
	return attrs
}

// Instrument wraps d so every call is timed in BackendCalls and traced as a
// child span "<backend>.<Method>". Attributes carry names and IDs only:
// requests hold secrets (cloud-init, passwords) and are never recorded.
func Instrument(backend string, d proxy.Driver) proxy.Driver {
	return &instrumented{backend: backend, d: d}
}

type instrumented struct {
	backend string
	d       proxy.Driver
}

func (i *instrumented) start(ctx context.Context, method string, attrs ...attribute.KeyValue) (context.Context, func(error)) {
	t0 := time.Now()
	ctx, span := Tracer().Start(ctx, i.backend+"."+method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(attrs, attribute.String("egressproxy.backend", i.backend))...))
	return ctx, func(err error) {
		class := ErrorClass(err)
		if err != nil {
			span.SetStatus(codes.Error, class)
			// OpenTelemetry's error.type: a low-cardinality class.
			span.SetAttributes(semconv.ErrorTypeKey.String(class))
		}
		span.End()
		BackendCalls.WithLabelValues(i.backend, method, class).Observe(time.Since(t0).Seconds())
	}
}

func (i *instrumented) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	ctx, done := i.start(ctx, "Create", attribute.String("egressproxy.name", req.Name))
	inst, err := i.d.Create(ctx, req)
	done(err)
	return inst, err
}

func (i *instrumented) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	ctx, done := i.start(ctx, "Get", attribute.String("egressproxy.name", ref.Name), attribute.String("egressproxy.id", ref.ID))
	inst, err := i.d.Get(ctx, ref)
	done(err)
	return inst, err
}

func (i *instrumented) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	ctx, done := i.start(ctx, "Update", attribute.String("egressproxy.name", ref.Name), attribute.String("egressproxy.id", ref.ID))
	inst, err := i.d.Update(ctx, ref, req)
	done(err)
	return inst, err
}

func (i *instrumented) Delete(ctx context.Context, ref proxy.Ref) error {
	ctx, done := i.start(ctx, "Delete", attribute.String("egressproxy.name", ref.Name), attribute.String("egressproxy.id", ref.ID))
	err := i.d.Delete(ctx, ref)
	done(err)
	return err
}

func (i *instrumented) List(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	ctx, done := i.start(ctx, "List")
	out, err := i.d.List(ctx, installationID)
	done(err)
	return out, err
}

func (i *instrumented) Check(ctx context.Context) proxy.Health {
	ctx, done := i.start(ctx, "Check")
	h := i.d.Check(ctx)
	var err error
	if !h.Healthy() {
		err = proxy.Transientf("unhealthy")
	}
	done(err)
	return h
}
