package telemetry

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// Logger is l with the trace_id and span_id of ctx's span, when ctx has
// one, so a log line can be found from its trace and the other way round.
// Every backend's log helper goes through it.
func Logger(ctx context.Context, l logr.Logger) logr.Logger {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return l
	}
	return l.WithValues("trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String())
}

// Call is one request a backend driver makes to its backend (a libvirt
// RPC, an HTTP request to the Proxmox, Compute Engine or Kubernetes API):
// a client span, a child of the caller's, a V(1) log line and an
// observation of BackendRequests. Every backend's seam decorator is built
// on it, so the four report calls alike. Span attributes and log fields
// carry names and identifiers only: never a body, a header, a token or a
// password.
type Call struct {
	ctx     context.Context
	span    trace.Span
	backend string
	name    string
	t0      time.Time
}

// StartCall starts the call name (low-cardinality: "DomainGetState",
// "instances.get", "get pods") of backend, as the span spanName of tracer
// (nil: Tracer()).
func StartCall(ctx context.Context, tracer trace.Tracer, backend, name, spanName string, attrs ...attribute.KeyValue) (context.Context, *Call) {
	if tracer == nil {
		tracer = Tracer()
	}
	ctx, span := tracer.Start(ctx, spanName, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(attrs, attribute.String("egressproxy.backend", backend), attribute.String("egressproxy.call", name))...))
	return ctx, &Call{ctx: ctx, span: span, backend: backend, name: name, t0: time.Now()}
}

// SetAttributes adds attributes to the call's span.
func (c *Call) SetAttributes(attrs ...attribute.KeyValue) { c.span.SetAttributes(attrs...) }

// End ends the call with err, its class taken from err (ErrorClass), and
// logs msg at V(1) on log with the call's name and duration, the error's
// message when there is one, and kv. log is the backend's logger of the
// context StartCall returned (made by Logger), so that the line carries
// the call span's trace_id and span_id.
func (c *Call) End(log logr.Logger, msg string, err error, kv ...any) {
	c.EndClass(log, msg, err, ErrorClass(err), kv...)
}

// EndClass is End with the error class given (an HTTP status has one
// without a Go error).
func (c *Call) EndClass(log logr.Logger, msg string, err error, class string, kv ...any) {
	took := time.Since(c.t0)
	if class != "none" {
		c.span.SetStatus(codes.Error, class)
		c.span.SetAttributes(semconv.ErrorTypeKey.String(class))
	}
	fields := append([]any{"call", c.name, "duration", took.Round(time.Microsecond).String()}, kv...)
	if err != nil {
		fields = append(fields, "error", err.Error())
	}
	log.V(1).Info(msg, fields...)
	c.span.End()
	BackendRequests.WithLabelValues(c.backend, c.name, class).Observe(took.Seconds())
}

// HTTPErrorClass is the error class of an HTTP answer: none for 1xx to
// 3xx, not_found for 404, quota for 429, permanent for another 4xx and
// transient for a 5xx.
func HTTPErrorClass(status int) string {
	switch {
	case status < 400:
		return "none"
	case status == http.StatusNotFound:
		return "not_found"
	case status == http.StatusTooManyRequests:
		return "quota"
	case status < 500:
		return "permanent"
	default:
		return "transient"
	}
}

// Transport wraps rt so that every request is a Call of backend: the span
// "<backend>.<route>", the log line "<backend> api call" with the HTTP
// method, the call and the status, and BackendRequests. route names the
// call from the request, with no identifier in it (the API method, such
// as instances.get, or "get pods"). It is what the GCP driver's Compute
// Engine client and the Kubernetes clients are built on
// (option.WithHTTPClient, rest.Config.WrapTransport). Nothing of the
// request but its method, its host and route is recorded: never a
// header, a query or a body.
func Transport(backend string, route func(*http.Request) string, log func(context.Context) logr.Logger, rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &transport{backend: backend, route: route, log: log, next: rt}
}

type transport struct {
	backend string
	route   func(*http.Request) string
	log     func(context.Context) logr.Logger
	next    http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	name := t.route(req)
	attrs := append(ServerAttributes(req.URL.Host), semconv.HTTPRequestMethodKey.String(req.Method))
	ctx, call := StartCall(req.Context(), nil, t.backend, name, t.backend+"."+name, attrs...)
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	log := Logger(ctx, logr.FromContextOrDiscard(ctx))
	if t.log != nil {
		log = t.log(ctx)
	}
	msg := t.backend + " api call"
	if err != nil {
		call.EndClass(log, msg, err, "transient", "method", req.Method)
		return resp, err
	}
	call.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	call.EndClass(log, msg, nil, HTTPErrorClass(resp.StatusCode), "method", req.Method, "httpStatus", strconv.Itoa(resp.StatusCode))
	return resp, nil
}
