package telemetry

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry/otlptest"
)

// TestInstrument: every driver call through Instrument is one client span
// "<backend>.<Method>", a child of the caller's, with the error's class as
// its status, and one observation of BackendCalls labelled the same; the
// request's secrets (password, cloud-init, TLS key) appear in no attribute.
func TestInstrument(t *testing.T) {
	const sentinel = "sentinel-5b2e77"
	rec := otlptest.Record(t)

	mem := proxytest.NewMemory("memory", "inst")
	d := Instrument("unit", mem)
	ctx, parent := otel.Tracer("t").Start(context.Background(), "egressproxy.Create")
	req := mem.Request("px-1", "uid-1")
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: sentinel}
	req.CloudInit = "#cloud-config\n" + sentinel
	req.Proxy.TLS = &proxy.TLS{Cert: "chain", Key: "-----BEGIN PRIVATE KEY-----\n" + sentinel + "\n-----END PRIVATE KEY-----\n", CA: "ca"}
	inst, err := d.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(ctx, proxy.Ref{ID: inst.ID, Name: "px-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(ctx, proxy.Ref{Name: "px-gone"}); !proxy.IsNotFound(err) {
		t.Fatalf("Get of a missing instance = %v; want NotFound through the decorator", err)
	}
	mem.FailNext(proxytest.OpDelete, proxy.Quotaf("full"))
	if err := d.Delete(ctx, proxy.Ref{ID: inst.ID}); !proxy.IsQuota(err) {
		t.Fatalf("Delete = %v; want the driver's Quota error unchanged", err)
	}
	parent.End()

	type span struct {
		Name, Status, Class string
		Child               bool
	}
	var got []span
	for _, s := range rec.Ended() {
		if s.Name() == "egressproxy.Create" {
			continue
		}
		class := ""
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), sentinel) {
				t.Errorf("span %s attribute %s carries a secret", s.Name(), a.Key)
			}
			if a.Key == "error.type" {
				class = a.Value.AsString()
			}
		}
		got = append(got, span{Name: s.Name(), Status: s.Status().Code.String(), Class: class, Child: s.Parent().SpanID() == parent.SpanContext().SpanID()})
	}
	want := []span{
		{Name: "unit.Create", Status: codes.Unset.String(), Child: true},
		{Name: "unit.Get", Status: codes.Unset.String(), Child: true},
		{Name: "unit.Get", Status: codes.Error.String(), Class: "not_found", Child: true},
		{Name: "unit.Delete", Status: codes.Error.String(), Class: "quota", Child: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("spans: -want, +got:\n%s", diff)
	}
	for _, l := range []struct {
		method, class string
		want          int
	}{{"Create", "none", 1}, {"Get", "none", 1}, {"Get", "not_found", 1}, {"Delete", "quota", 1}} {
		var m dto.Metric
		if err := BackendCalls.WithLabelValues("unit", l.method, l.class).(prometheus.Metric).Write(&m); err != nil { //nolint:forcetypeassert // A histogram vector's observers are metrics.
			t.Fatal(err)
		}
		if n := m.GetHistogram().GetSampleCount(); n != uint64(l.want) { //nolint:gosec // A small count.
			t.Errorf("BackendCalls{unit,%s,%s}: %d observations; want %d", l.method, l.class, n, l.want)
		}
	}
}

// TestInstrumentCheck: an unhealthy check is an error span, transient.
func TestInstrumentCheck(t *testing.T) {
	rec := otlptest.Record(t)

	mem := proxytest.NewMemory("memory", "inst")
	mem.SetBusy(true)
	if h := Instrument("unit", mem).Check(context.Background()); h.Healthy() {
		t.Fatal("a busy memory backend checks healthy")
	}
	ended := rec.Ended()
	if len(ended) != 1 || ended[0].Name() != "unit.Check" || ended[0].Status().Code != codes.Error {
		t.Errorf("spans %v; want one unit.Check with an error status", ended)
	}
}
