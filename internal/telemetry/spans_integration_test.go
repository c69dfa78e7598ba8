package telemetry_test

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/api/option"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry/otlptest"
)

func TestMain(m *testing.M) { testenv.Main(m, kvmtest.Down) }

// requestSpan tells a backend's request spans (made by the decorator on
// its connections) from its driver spans (<backend>.<Method>, made by
// telemetry.Instrument).
func requestSpan(backend string, s otlptest.Span) bool {
	return strings.HasPrefix(s.Name, backend+".") && s.Attributes["egressproxy.call"] != ""
}

// TestBackendSpansIntegration: for one operation on each backend (an
// Observe of a proxy that does not exist: egressproxy.Observe around the
// driver's Get, as the controller makes them), exported by the provider's
// own exporter (SetupTracing over OTLP/gRPC) to a real receiver, every
// request the driver makes to its backend is a span whose parent is the
// driver's span, whose parent is the operation's; and the backends'
// credentials are in no span. The backends: a real libvirtd behind a real
// sshd (kvm), a real kube-apiserver (kubernetes, as a remote cluster,
// and as the provider's own, whose Observe reads a cache: there the
// operation is the config's health check), the Proxmox VE and Compute
// Engine fakes on the real clients (proxmox, gcp).
func TestBackendSpansIntegration(t *testing.T) {
	ctx := context.Background()
	rcv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+rcv.Endpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	enabled, shutdown, err := telemetry.SetupTracing(ctx, "test")
	if err != nil || !enabled {
		t.Fatalf("SetupTracing = %t, %v", enabled, err)
	}

	drivers := map[string]proxy.Driver{}
	var secrets []string

	// kvm: the real libvirt host.
	h := kvmtest.Up(t)
	b := kvm.NewBackend(kvm.Options{})
	t.Cleanup(b.Close)
	drivers["kvm"] = b.Driver(kvm.Config{Name: "ClusterProviderConfig spans", Credentials: h.Credentials(), Hosts: []kvm.Host{h.KVMHost("local")},
		MachineTypes: map[string]kvm.MachineType{"tiny": {VCPUs: 1, MemoryMiB: 256}}})
	secrets = append(secrets, string(h.Key))

	// proxmox: the fake on the real client.
	pve := pvetest.New(t, pvetest.Options{})
	pd, err := proxmox.New(proxmox.Options{
		Provider: "ClusterProviderConfig spans",
		Config: proxmox.Config{URL: pve.URL, Nodes: []string{"pve1"}, ISOStorage: "local", Bridge: "vmbr0", DiskGiB: 10,
			Templates: map[string]int{"debian-12": 9000}, MachineTypes: map[string]proxmox.MachineType{"small": {Cores: 1, MemoryMiB: 1024}}},
		Credentials: func(context.Context) (proxmox.Credentials, error) {
			return proxmox.Credentials{Token: pve.Token(), CA: pve.CAPEM()}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	drivers["proxmox"] = pd
	if _, secret, ok := strings.Cut(pve.Token(), "="); ok {
		secrets = append(secrets, secret)
	}

	// gcp: the fake on the driver's Compute Engine client.
	srv := gcptest.New(t, "egressproxy-spans")
	api, err := gcp.NewSDK(ctx, srv.Project, option.WithEndpoint(srv.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Close() })
	drivers["gcp"] = gcp.New(gcp.Options{Provider: "ClusterProviderConfig spans", API: api, Config: gcp.Config{Project: srv.Project, Network: "default",
		Images: map[string]string{"debian": "projects/debian-cloud/global/images/family/debian-12"}, MachineTypes: map[string]string{"small": "e2-small"}, Zones: []string{"europe-west1-b"}}})

	// kubernetes: a real API server, reached as a remote cluster.
	cp := controlplane.ForTest(t, controlplane.Options{})
	cl, err := (&kubernetes.Remote{Scheme: clientgoscheme.Scheme}).Cluster(cp.Kubeconfig, nil)
	if err != nil {
		t.Fatal(err)
	}
	drivers["kubernetes"] = cl.Driver("ClusterProviderConfig spans", kubernetes.Config{Namespace: "default"}, nil)
	if cp.Config.BearerToken != "" {
		secrets = append(secrets, cp.Config.BearerToken)
	}
	// ... and as the cluster the provider runs in, whose reads come from a
	// cache (a miss there costs no request): its operation is the config's
	// health check, which asks the API server for its version.
	informers, err := cache.New(cp.Config, cache.Options{Scheme: clientgoscheme.Scheme, ByObject: kubernetes.CacheByObject()})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go func() { _ = informers.Start(cctx) }()
	local, err := kubernetes.NewLocalCluster(cp.Config, clientgoscheme.Scheme, informers)
	if err != nil {
		t.Fatal(err)
	}
	drivers["kubernetes (this cluster)"] = local.Driver("ClusterProviderConfig spans-local", kubernetes.Config{Namespace: "default"}, nil)

	// The reconcile's logger, as controller-runtime puts it in the context,
	// at V(1): every backend request's line.
	var logs testenv.Buffer
	lctx := logr.NewContext(ctx, funcr.New(func(p, a string) { logs.Line(p + " " + a) }, funcr.Options{Verbosity: 1}))
	ops := map[string]string{} // backend: the operation's span ID
	traces := map[string]string{}
	for key, d := range drivers {
		backend := strings.Fields(key)[0]
		octx, op := telemetry.Tracer().Start(lctx, "egressproxy.Observe")
		ref := proxy.Ref{Name: "egp-spans-missing", Mark: proxy.Mark{UID: "6f1c2a7e-0000-4000-8000-000000000001", InstallationID: "spans"}}
		if backend == "gcp" {
			ref.Placement.Location = "europe-west1-b"
		}
		if strings.Contains(key, "this cluster") {
			if h := telemetry.Instrument(backend, d).Check(octx); !h.Healthy() {
				t.Errorf("%s: Check = %+v; want healthy", key, h)
			}
		} else if _, err := telemetry.Instrument(backend, d).Get(octx, ref); !proxy.IsNotFound(err) {
			t.Errorf("%s: Get of a proxy that does not exist = %v; want NotFound", key, err)
		}
		op.End()
		ops[key], traces[key] = op.SpanContext().SpanID().String(), op.SpanContext().TraceID().String()
	}
	if err := shutdown(ctx); err != nil {
		t.Fatalf("flushing the exporter: %v", err)
	}

	spans := rcv.Spans()
	byID := map[string]otlptest.Span{}
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	for key := range drivers {
		backend := strings.Fields(key)[0]
		var driverSpan *otlptest.Span
		var requests []otlptest.Span
		for _, s := range spans {
			if s.TraceID != traces[key] {
				continue
			}
			switch {
			case s.Name == backend+".Get" || s.Name == backend+".Check":
				driverSpan = &s
			case requestSpan(backend, s):
				requests = append(requests, s)
			}
		}
		if driverSpan == nil || driverSpan.ParentID != ops[key] {
			t.Errorf("%s: no span %s.Get that is a child of the operation's", key, backend)
			continue
		}
		if len(requests) == 0 {
			t.Errorf("%s: no backend request span in the operation's trace", key)
		}
		var names []string
		for _, s := range requests {
			names = append(names, s.Name)
			// The parent of a request span is the driver's span, or a span
			// of the backend's own below it (kvm's SSH dial).
			p := byID[s.ParentID]
			for p.SpanID != "" && p.SpanID != driverSpan.SpanID {
				p = byID[p.ParentID]
			}
			if p.SpanID != driverSpan.SpanID {
				t.Errorf("%s: request span %s is not below %s.Get", key, s.Name, backend)
			}
		}
		t.Logf("%s: %s -> %v", key, driverSpan.Name, names)
	}
	for _, s := range spans {
		for k, v := range s.Attributes {
			for _, secret := range secrets {
				if secret != "" && strings.Contains(v, secret) {
					t.Errorf("span %s attribute %s holds a credential", s.Name, k)
				}
			}
		}
	}

	// A log line per request, carrying the operation's trace, and the
	// credentials in none.
	for backend, msg := range map[string]string{"kvm": "libvirt call", "proxmox": "proxmox api call", "gcp": "gcp api call", "kubernetes": "kubernetes api call"} {
		found := false
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, `"msg"="`+msg+`"`) && strings.Contains(l, `"trace_id"="`+traces[backend]+`"`) && strings.Contains(l, `"span_id"=`) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no %q log line carrying the operation's trace_id and a span_id", backend, msg)
		}
	}
	for _, secret := range secrets {
		if secret != "" && strings.Contains(logs.String(), secret) {
			t.Errorf("a credential is in the log lines")
		}
	}

	// And an observation of the request-duration metric per backend.
	reg := prometheus.NewRegistry()
	reg.MustRegister(telemetry.BackendRequests)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "backend" {
					counts[l.GetValue()] += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	for key := range drivers {
		backend := strings.Fields(key)[0]
		if counts[backend] == 0 {
			t.Errorf("%s: no egressproxy_backend_request_duration_seconds observation", backend)
		}
	}
}
