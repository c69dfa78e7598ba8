package kvm

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// TestObserve_everySeamMethodInstrumented walks the seam by reflection:
// every method but Close produces exactly one span kvm.libvirt.<Method>,
// a child of the caller's span, and exactly one log line.
func TestObserve_everySeamMethodInstrumented(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	logs := &testenv.Buffer{}
	log := funcr.New(func(p, a string) { logs.Line(p + " " + a) }, funcr.Options{Verbosity: 1})
	o := &observed{next: newFakeHost().conn(), host: "lab", tracer: tp.Tracer("t"), log: func(context.Context) logr.Logger { return log }}
	typ := reflect.TypeOf((*Libvirt)(nil)).Elem()
	ctx, parent := tp.Tracer("t").Start(context.Background(), "kvm.Create")
	for i := range typ.NumMethod() {
		m := typ.Method(i)
		if m.Name == "Close" {
			continue
		}
		before, lines := len(rec.Ended()), strings.Count(logs.String(), "\n")
		fn := reflect.ValueOf(o).MethodByName(m.Name)
		args := []reflect.Value{reflect.ValueOf(ctx)}
		for j := 1; j < fn.Type().NumIn(); j++ {
			in := fn.Type().In(j)
			switch in.Kind() {
			case reflect.Interface:
				if in.Implements(reflect.TypeOf((*interface{ Read([]byte) (int, error) })(nil)).Elem()) || in.String() == "io.Reader" {
					args = append(args, reflect.ValueOf(strings.NewReader("")))
				} else {
					args = append(args, reflect.ValueOf(&strings.Builder{}))
				}
			default:
				args = append(args, reflect.Zero(in))
			}
		}
		fn.Call(args)
		spans := rec.Ended()[before:]
		if len(spans) != 1 || spans[0].Name() != spanPrefix+m.Name {
			names := []string{}
			for _, s := range spans {
				names = append(names, s.Name())
			}
			t.Errorf("%s: spans %v; want exactly [%s]", m.Name, names, spanPrefix+m.Name)
			continue
		}
		if spans[0].Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s: span is not a child of the operation's span", m.Name)
		}
		if n := strings.Count(logs.String(), "\n") - lines; n != 1 {
			t.Errorf("%s: %d log lines; want 1", m.Name, n)
		}
	}
	parent.End()
	if !strings.Contains(logs.String(), `"rpc"="DomainLookupByName"`) || !strings.Contains(logs.String(), `"libvirtError"="NoDomain"`) {
		t.Errorf("log lines lack rpc or libvirt error fields:\n%s", logs.String())
	}
	_ = trace.SpanKindClient
}
