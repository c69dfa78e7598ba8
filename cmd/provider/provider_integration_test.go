package main_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	changelogsv1alpha1 "github.com/crossplane/crossplane-runtime/v2/apis/changelogs/proto/v1alpha1"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/version"
)

// collector is an OTLP/HTTP trace receiver that records span names and,
// per name, the attributes seen (key=value).
type collector struct {
	mu    sync.Mutex
	spans map[string]int
	attrs map[string]map[string]bool
}

// attributes are the key=value pairs seen on spans named name.
func (c *collector) attributes(name string) map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]bool{}
	for k := range c.attrs[name] {
		out[k] = true
	}
	return out
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	req := &collectortrace.ExportTraceServiceRequest{}
	if err := proto.Unmarshal(b, req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans[s.GetName()]++
				if c.attrs == nil {
					c.attrs = map[string]map[string]bool{}
				}
				if c.attrs[s.GetName()] == nil {
					c.attrs[s.GetName()] = map[string]bool{}
				}
				for _, a := range s.GetAttributes() {
					v := a.GetValue()
					val := v.GetStringValue()
					if v.GetIntValue() != 0 {
						val = fmt.Sprint(v.GetIntValue())
					}
					c.attrs[s.GetName()][a.GetKey()+"="+val] = true
				}
			}
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// changeLogs is a change log sidecar: a ChangeLogService on a Unix socket
// recording every entry.
type changeLogs struct {
	changelogsv1alpha1.UnimplementedChangeLogServiceServer
	mu      sync.Mutex
	entries []*changelogsv1alpha1.ChangeLogEntry
}

func (c *changeLogs) SendChangeLog(_ context.Context, r *changelogsv1alpha1.SendChangeLogRequest) (*changelogsv1alpha1.SendChangeLogResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = append(c.entries, r.GetEntry())
	return &changelogsv1alpha1.SendChangeLogResponse{}, nil
}

func (c *changeLogs) all() []*changelogsv1alpha1.ChangeLogEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.entries)
}

func (c *collector) names() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.spans {
		out[k] = v
	}
	return out
}

// buildProvider builds this package's binary for a test that runs it as
// a process, and returns the repository's root and the binary.
func buildProvider(t *testing.T) (root, bin string) {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(t.TempDir(), "provider")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("go build: %v", err)
	}
	return root, bin
}

// TestProviderIntegration runs the built provider binary, as `make run`
// does, against a real control plane: the examples are applied, every
// managed resource gets a Synced condition with a clear message, the
// metrics endpoint serves the runtime's and the provider's metrics, spans
// reach an OTLP collector, and no secret of the examples appears in the
// provider's debug logs, events or conditions.
func TestProviderIntegration(t *testing.T) {
	root, bin := buildProvider(t)
	t.Run("EveryFlagAndItsVariableDocumented", func(t *testing.T) {
		help, _ := exec.Command(bin, "--help").CombinedOutput()
		doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
		if err != nil {
			t.Fatal(err)
		}
		flags := regexp.MustCompile(`(?m)^  --([a-z0-9-]+) \(([A-Z0-9_]+(?:, also [A-Z0-9_]+)*|no variable), default`).FindAllStringSubmatch(string(help), -1)
		if len(flags) < 20 {
			t.Fatalf("--help lists %d flags:\n%s", len(flags), help)
		}
		for _, f := range flags {
			// Every variable of the flag, in its order: `A`, `B`.
			vars := "`" + strings.Join(strings.Split(f[2], ", also "), "`, `") + "`"
			if !strings.HasPrefix(f[2], "EGRESSPROXY_") && f[2] != "no variable" {
				t.Errorf("--%s is read from %s; want EGRESSPROXY_ first", f[1], f[2])
			}
			row := regexp.MustCompile("(?m)^\\| `--" + f[1] + "` \\| " + regexp.QuoteMeta(vars) + " \\|")
			if f[2] == "no variable" {
				row = regexp.MustCompile("(?m)^\\| `--" + f[1] + "` \\| no variable \\|")
			}
			if !row.Match(doc) {
				t.Errorf("docs/operations.md has no row | `--%s` | %s | in its flags table", f[1], vars)
			}
		}
	})

	cp := controlplane.ForTest(t, controlplane.Options{CRDDirectories: []string{filepath.Join(root, "package", "crds")}})
	kube, err := client.New(cp.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Sentinels: secret values placed where users put secrets.
	const pwSentinel = "SENTINEL-password-7f3a9c"
	const cloudInitSentinel = "SENTINEL-cloudinit-2b8e41"
	objs := examples(t, root)
	for _, o := range objs {
		if o.GetKind() == "Secret" && o.GetName() == "payments-proxy-pw" {
			_ = unstructured.SetNestedField(o.Object, pwSentinel, "stringData", "password")
		}
		if o.GetKind() == "KVMProxy" && o.GetNamespace() == "team-payments" {
			_ = unstructured.SetNestedField(o.Object, "#cloud-config\nwrite_files: [{path: /x, content: "+cloudInitSentinel+"}]\n", "spec", "forProvider", "cloudInit")
		}
		// The examples' Proxmox API is a placeholder host: point it at a
		// closed local port so the test sends nothing off this machine.
		if _, found, _ := unstructured.NestedString(o.Object, "spec", "proxmox", "url"); found {
			_ = unstructured.SetNestedField(o.Object, "https://127.0.0.1:9", "spec", "proxmox", "url")
		}
	}

	for _, o := range objs {
		if err := kube.Create(ctx, o.DeepCopy()); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}

	col := &collector{spans: map[string]int{}}
	otlp := httptest.NewServer(col)
	defer otlp.Close()

	// The change log sidecar's socket, in a short path (sun_path holds 108
	// bytes).
	sockDir, err := os.MkdirTemp("", "cl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "changelogs.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	cl := &changeLogs{}
	gs := grpc.NewServer()
	changelogsv1alpha1.RegisterChangeLogServiceServer(gs, cl)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	metricsAddr, probeAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	out := &testenv.Buffer{}
	pctx, stop := context.WithCancel(ctx)
	cmd := exec.CommandContext(pctx, bin, "--debug", "--metrics-bind-address", metricsAddr, "--health-probe-bind-address", probeAddr,
		"--poll-not-ready", "2s", "--config-check-interval", "2s")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.KubeconfigPath,
		"OTEL_EXPORTER_OTLP_ENDPOINT="+otlp.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_BSP_SCHEDULE_DELAY=200",
		// Application Default Credentials would probe the GCE metadata
		// server; keep that on a closed local port.
		"GCE_METADATA_HOST=127.0.0.1:9",
		// Flags from the environment, as a DeploymentRuntimeConfig sets
		// them: the alias the Crossplane providers read, and a prefixed
		// name. An unprefixed name sets nothing (it would not parse).
		"ENABLE_CHANGE_LOGS=true", "EGRESSPROXY_CHANGELOGS_SOCKET_PATH="+sock, "POLL=soon")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("provider output (tail):\n%s", tail(out.String(), 60))
		}
	})

	// Start to serving: from exec to the first managed resource the
	// provider has reconciled (it existed before the provider started).
	first := &unstructured.Unstructured{}
	first.SetAPIVersion("proxy.m.egressproxy.io/v1alpha1")
	first.SetKind("PodProxy")
	testenv.WaitFor(t, "the provider to reconcile its first resource", 60*time.Second, func() (bool, string) {
		if err := kube.Get(ctx, client.ObjectKey{Namespace: "team-payments", Name: "payments-egress"}, first); err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(first.Object, "status", "conditions")
		return len(conds) > 0, tail(out.String(), 3)
	})
	t.Logf("provider start to serving (exec to first reconciled resource): %.2f s", time.Since(started).Seconds())
	if !strings.Contains(out.String(), "provider started") {
		t.Errorf("the provider did not log that it started")
	}
	// The start line names the image a config that names none runs.
	if !strings.Contains(out.String(), `"podProxyImage":"`+kubernetes.DevImage+`"`) {
		t.Errorf("the start line does not name the default PodProxy image %s", kubernetes.DevImage)
	}

	// Every managed resource carries a Synced condition with a message.
	want := map[string]string{
		"KVMProxy":     "does not parse as an SSH private key", // the examples hold a placeholder key
		"ProxmoxProxy": "connection refused",                   // nothing listens on the test's API port
		"GCPProxy":     "service-account key",                  // the examples hold a placeholder key
	}
	// The GCP examples with InjectedIdentity reach for the metadata server,
	// which the test keeps on a closed local port.
	wantByConfig := map[string]string{"gcp-workload-identity": "127.0.0.1:9", "team-pve": "holds no PEM certificate"}
	for _, o := range objs {
		msg, ok := want[o.GetKind()]
		if !ok || !strings.HasPrefix(o.GetAPIVersion(), "proxy.") {
			continue
		}
		if pc, _, _ := unstructured.NestedString(o.Object, "spec", "providerConfigRef", "name"); wantByConfig[pc] != "" {
			msg = wantByConfig[pc]
		}
		u := o.DeepCopy()
		testenv.WaitFor(t, fmt.Sprintf("%s %s/%s Synced=False", o.GetKind(), o.GetNamespace(), o.GetName()), 30*time.Second, func() (bool, string) {
			if err := kube.Get(ctx, client.ObjectKeyFromObject(o), u); err != nil {
				return false, err.Error()
			}
			st, reasonMessage := localcrossplane.Condition(u, "Synced")
			return st == "False" && strings.Contains(reasonMessage, msg), "Synced=" + st + " " + reasonMessage
		})
	}

	t.Run("ChangeLogsFromTheEnvironment", func(t *testing.T) {
		var create *changelogsv1alpha1.ChangeLogEntry
		testenv.WaitFor(t, "a change log entry for the create of PodProxy team-payments/payments-egress", 60*time.Second, func() (bool, string) {
			var seen []string
			for _, e := range cl.all() {
				if e.GetKind() == "PodProxy" && e.GetName() == "payments-egress" && e.GetOperation() == changelogsv1alpha1.OperationType_OPERATION_TYPE_CREATE {
					create = e
					return true, ""
				}
				seen = append(seen, e.GetKind()+" "+e.GetName()+" "+e.GetOperation().String())
			}
			return false, fmt.Sprint(seen)
		})
		if create.GetProvider() != "provider-egressproxy:"+version.Version || create.GetApiVersion() != "proxy.m.egressproxy.io/v1alpha1" ||
			create.GetExternalName() == "" || create.GetErrorMessage() != "" || create.GetSnapshot() == nil {
			t.Errorf("change log entry: provider %q apiVersion %q external name %q error %q snapshot %v",
				create.GetProvider(), create.GetApiVersion(), create.GetExternalName(), create.GetErrorMessage(), create.GetSnapshot() != nil)
		}
		for _, e := range cl.all() {
			if b, _ := protojson.Marshal(e); strings.Contains(string(b), pwSentinel) {
				t.Errorf("the password sentinel appears in the change log entry for %s %s", e.GetKind(), e.GetName())
			}
		}
	})

	t.Run("MetricsEndpoint", func(t *testing.T) {
		// scrape waits until /metrics has every one of want, and keeps
		// the last page in body.
		var body string
		scrape := func(what string, want ...string) {
			testenv.WaitFor(t, what, 60*time.Second, func() (bool, string) {
				resp, err := http.Get("http://" + metricsAddr + "/metrics")
				if err != nil {
					return false, err.Error()
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				body = string(b)
				for _, w := range want {
					if !strings.Contains(body, w) {
						return false, "no " + w
					}
				}
				return true, ""
			})
		}
		scrape("the metrics to show backend calls", "egressproxy_backend_call_duration_seconds_count", "crossplane_managed_resource_exists")
		scrape("the config health gauge", `egressproxy_provider_config_target_healthy{backend="`)
		for _, m := range []string{`egressproxy_backend_call_duration_seconds_count{backend="`, `error_class="transient"`, `error_class="none"`,
			`egressproxy_provider_config_target_healthy{backend="kubernetes",kind="ClusterProviderConfig",name="`,
			"crossplane_managed_resource_exists", "controller_runtime_reconcile_total"} {
			if !strings.Contains(body, m) {
				t.Errorf("/metrics has no %s", m)
			}
		}
		if strings.Contains(strings.ReplaceAll(body, `error_class="`, ""), `class="`) {
			t.Errorf("/metrics has a label named class (it is error_class; class is an EgressProxy's offering)")
		}
	})

	t.Run("TracesReachTheCollector", func(t *testing.T) {
		testenv.WaitFor(t, "config-check spans", 60*time.Second, func() (bool, string) {
			n := col.names()
			return n["egressproxy.CheckConfig"] > 0, fmt.Sprint(n)
		})
		t.Logf("span names seen: %v", col.names())
		// OpenTelemetry's semantic conventions: the examples' Proxmox API
		// is a closed local port, so its calls fail.
		testenv.WaitFor(t, "a proxmox driver span with error.type and a proxmox API span with server.address", 60*time.Second, func() (bool, string) {
			drv, api := col.attributes("proxmox.Check"), col.attributes("proxmox.Version")
			return drv["error.type=transient"] && api["server.address=127.0.0.1"] && api["server.port=9"], fmt.Sprint(drv, api, col.names())
		})
		if a := col.attributes("egressproxy.Observe"); !a["k8s.namespace.name=team-payments"] {
			t.Errorf("egressproxy.Observe spans carry %v; want k8s.namespace.name", a)
		}
	})

	t.Run("SecretsNeverLeak", func(t *testing.T) {
		time.Sleep(2 * time.Second) // a few more reconciles with the sentinels in place
		// Events wait while resources are being written (a minute at
		// most): every one recorded so far is read once it was sent.
		testenv.WaitFor(t, "the provider's events to be sent", 90*time.Second, func() (bool, string) {
			resp, err := http.Get("http://" + metricsAddr + "/metrics")
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "egressproxy_events_queued "); ok {
					return v == "0", "queued: " + v
				}
			}
			return false, "no egressproxy_events_queued on /metrics"
		})
		logs := out.String()
		events := &corev1.EventList{}
		if err := kube.List(ctx, events); err != nil {
			t.Fatal(err)
		}
		var ev strings.Builder
		for _, e := range events.Items {
			ev.WriteString(e.Message + "\n")
		}
		var status strings.Builder
		for _, o := range objs {
			u := o.DeepCopy()
			if err := kube.Get(ctx, client.ObjectKeyFromObject(o), u); err == nil {
				fmt.Fprint(&status, u.Object["status"])
			}
		}
		for _, s := range []string{pwSentinel, cloudInitSentinel} {
			for where, text := range map[string]string{"logs": logs, "events": ev.String(), "status": status.String()} {
				if strings.Contains(text, s) {
					t.Errorf("secret %q appears in the provider's %s", s, where)
				}
			}
		}
		if ev.Len() == 0 {
			t.Error("no events recorded: the sentinel check saw nothing")
		}
	})
	_ = metav1.Now
}

func examples(t *testing.T, root string) []*unstructured.Unstructured {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(root, "examples", "*.yaml"))
	var out []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(bytes.NewReader(b)), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := d.Decode(&u.Object); err != nil {
				break
			}
			if len(u.Object) > 0 {
				out = append(out, u)
			}
		}
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
