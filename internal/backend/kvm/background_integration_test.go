package kvm_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/provider"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry/otlptest"
)

// TestIntegrationLibvirt_backgroundWorkInTheCreatesTrace: on the real
// libvirtd behind the real sshd, with the provider's exporter sending to
// a real OTLP receiver and the provider's logger in the reconcile's
// context (as production wires them: no Options.Log), a Create whose
// image is not on the host returns at once, and the work it leaves to
// the background is in its trace: the download (its SSH dial, its HTTP
// request, its libvirt calls) below kvm.image.fetch and the define and
// start below kvm.create.finish, both children of kvm.Create. A create
// whose download fails logs "kvm background create failed" at info, with
// provider, host, name and the create's trace.
func TestIntegrationLibvirt_backgroundWorkInTheCreatesTrace(t *testing.T) {
	h := kvmtest.Up(t)
	url := emptyImage(t)
	rcv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+rcv.Endpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	prev := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	enabled, shutdown, err := telemetry.SetupTracing(context.Background(), "test")
	if err != nil || !enabled {
		t.Fatalf("SetupTracing = %t, %v", enabled, err)
	}

	var out testenv.Buffer
	ctx := logr.NewContext(context.Background(), provider.NewLogger(0, false, "json", &out))
	b := kvm.NewBackend(kvm.Options{})
	t.Cleanup(b.Close)
	const providerName = "ClusterProviderConfig background"
	d := telemetry.Instrument("kvm", b.Driver(kvm.Config{
		Name:         providerName,
		Credentials:  h.Credentials(),
		DiskSizeGB:   1,
		Images:       map[string]kvm.Image{"empty": {URL: url}, "missing": {URL: strings.TrimSuffix(url, "empty.qcow2") + "missing.qcow2"}},
		MachineTypes: map[string]kvm.MachineType{"tiny": {VCPUs: 1, MemoryMiB: 256}},
		Hosts:        []kvm.Host{h.KVMHost("local")},
	}))
	// The libvirtd is shared with concurrent runs (the packages of one make
	// test, other clones): names and the installation are this run's own.
	run := runSuffix()
	request := func(name, image, uid string) proxy.Request {
		return proxy.Request{Name: name + "-" + run, Mark: proxy.Mark{UID: uid, InstallationID: "integration-" + run},
			Placement: proxy.Placement{Location: "local", MachineType: "tiny", Image: image},
			Proxy:     proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"192.168.213.0/24"}, AllowedPorts: []int32{443}}}
	}
	// create runs Create inside an operation's span, as the controller
	// does, and returns the span's trace.
	create := func(req proxy.Request) (proxy.Instance, string) {
		octx, op := telemetry.Tracer().Start(ctx, "egressproxy.Create")
		defer op.End()
		inst, err := d.Create(octx, req)
		if err != nil {
			t.Fatalf("Create %s: %v", req.Name, err)
		}
		if inst.State != proxy.StateProvisioning {
			t.Errorf("Create %s: %s; want Provisioning (the image is downloaded in the background)", req.Name, inst.State)
		}
		t.Cleanup(func() { _ = d.Delete(context.Background(), proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}) })
		return inst, op.SpanContext().TraceID().String()
	}
	ok := request("egp-it-bgtrace", "empty", "0c8f6a1e-0000-4e2a-9c3f-00000000b901")
	inst, okTrace := create(ok)
	failing := request("egp-it-bgfail", "missing", "0c8f6a1e-0000-4e2a-9c3f-00000000b902")
	_, failTrace := create(failing)

	// The first is defined and started in the background.
	r := proxy.Ref{ID: inst.ID, Name: ok.Name, Mark: ok.Mark, Placement: ok.Placement}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		got, err := d.Get(ctx, r)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if strings.HasPrefix(got.Progress, "booting") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not started in 2 minutes: %+v", ok.Name, got)
		}
	}
	// The second's failure is logged by the reconcile's logger.
	var failure map[string]any
	for deadline := time.Now().Add(time.Minute); failure == nil && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for _, line := range strings.Split(out.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "kvm background create failed" {
				failure = m
			}
		}
	}
	if failure == nil {
		t.Fatalf("no line kvm background create failed in the provider's log:\n%s", out.String())
	}
	for k, want := range map[string]string{"level": "info", "logger": "kvm", "provider": providerName, "host": "local", "name": failing.Name, "trace_id": failTrace} {
		if got, _ := failure[k].(string); got != want {
			t.Errorf("the failure line's %s is %q; want %q: %v", k, got, want, failure)
		}
	}
	if e, _ := failure["error"].(string); !strings.Contains(e, "404") {
		t.Errorf("the failure line's error %q does not say what the server answered", e)
	}

	if err := shutdown(context.Background()); err != nil {
		t.Fatalf("flushing the exporter: %v", err)
	}
	spans := rcv.Spans()
	byID := map[string]otlptest.Span{}
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	under := func(s otlptest.Span, ancestor string) bool {
		for p := byID[s.ParentID]; p.SpanID != ""; p = byID[p.ParentID] {
			if p.SpanID == ancestor {
				return true
			}
		}
		return false
	}
	find := func(trace, name, ancestor string) []otlptest.Span {
		var out []otlptest.Span
		for _, s := range spans {
			if s.TraceID == trace && s.Name == name && (ancestor == "" || under(s, ancestor)) {
				out = append(out, s)
			}
		}
		return out
	}
	for _, tc := range []struct {
		trace string
		below map[string][]string // background span: what must be below it
	}{
		{okTrace, map[string][]string{
			"kvm.image.fetch":   {"kvm.dial", "kvm.image.download", "kvm.libvirt.StorageVolCreateXML", "kvm.libvirt.StorageVolUpload", "kvm.libvirt.StoragePoolRefresh"},
			"kvm.create.finish": {"kvm.libvirt.DomainDefineXML", "kvm.libvirt.DomainCreate"},
		}},
		{failTrace, map[string][]string{
			"kvm.image.fetch":   {"kvm.dial", "kvm.image.download"},
			"kvm.create.finish": nil,
		}},
	} {
		creates := find(tc.trace, "kvm.Create", "")
		if len(creates) != 1 {
			t.Errorf("trace %s: %d kvm.Create spans; want 1", tc.trace, len(creates))
			continue
		}
		for bg, wants := range tc.below {
			got := find(tc.trace, bg, "")
			if len(got) != 1 || got[0].ParentID != creates[0].SpanID {
				t.Errorf("trace %s: %d %s spans; want one, a child of kvm.Create", tc.trace, len(got), bg)
				continue
			}
			var names []string
			for _, w := range wants {
				if len(find(tc.trace, w, got[0].SpanID)) == 0 {
					t.Errorf("trace %s: no %s below %s", tc.trace, w, bg)
				}
			}
			for _, s := range spans {
				if under(s, got[0].SpanID) {
					names = append(names, s.Name)
				}
			}
			t.Logf("trace %s: kvm.Create -> %s -> %v", tc.trace, bg, names)
		}
	}
	for _, s := range spans {
		for k, v := range s.Attributes {
			if strings.Contains(v, string(h.Key)) {
				t.Errorf("span %s attribute %s holds the SSH key", s.Name, k)
			}
		}
	}

	if err := d.Delete(ctx, r); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	// The base volumes of this run's image URLs (new each run: the
	// server's port), and no other volume of the shared pool.
	var vols []string
	for key, im := range map[string]string{"empty": url, "missing": strings.TrimSuffix(url, "empty.qcow2") + "missing.qcow2"} {
		vols = append(vols, kvm.BaseVolumes(key, im, "", "qcow2", false)...)
	}
	h.DeleteVolumes(t, vols...)
}
