package proxmox_test

import (
	"context"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
)

// TestEveryCallMatchesTheSchema calls every method of the seam through the
// production client, wrapped by its decorator, against the fake (which
// checks each request's path, method and parameters, and each of its own
// answers, against the published schema): the test fails on any
// violation, each method hits exactly its endpoint, and each call makes
// exactly one span and one log line.
func TestEveryCallMatchesTheSchema(t *testing.T) {
	fake := pvetest.New(t, pvetest.Options{Durations: pvetest.FastDurations})
	creds := func(context.Context) (proxmox.Credentials, error) {
		return proxmox.Credentials{Token: fake.Token(), CA: fake.CAPEM()}, nil
	}
	client, err := proxmox.NewClient(fake.URL, creds, false, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(_, args string) { mu.Lock(); lines = append(lines, args); mu.Unlock() }, funcr.Options{Verbosity: 1})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	api := proxmox.Observe(client, "127.0.0.1:8006", func(context.Context) logr.Logger { return log })

	ctx := context.Background()
	vmid := fake.AddVM(pvetest.VMSpec{Name: "pt-endpoints", Running: true})
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var upid string
	calls := map[string]func(){
		"Version":       func() { _, err := api.Version(ctx); must("Version", err) },
		"Resources":     func() { _, err := api.Resources(ctx, "vm"); must("Resources", err) },
		"NodeStatus":    func() { _, err := api.NodeStatus(ctx, "pve1"); must("NodeStatus", err) },
		"NodeNetwork":   func() { _, err := api.NodeNetwork(ctx, "pve1"); must("NodeNetwork", err) },
		"StorageStatus": func() { _, err := api.StorageStatus(ctx, "pve1", "local"); must("StorageStatus", err) },
		"ISOs":          func() { _, err := api.ISOs(ctx, "pve1", "local"); must("ISOs", err) },
		"Upload": func() {
			_, err := api.Upload(ctx, "pve1", "local", "egressproxy-pt-endpoints-0123456789ab.iso", []byte("not really an ISO"))
			must("Upload", err)
		},
		"DeleteVolume": func() {
			_, err := api.DeleteVolume(ctx, "pve1", "local:iso/egressproxy-pt-endpoints-0123456789ab.iso")
			must("DeleteVolume", err)
		},
		"VMConfig": func() { _, err := api.VMConfig(ctx, "pve1", vmid); must("VMConfig", err) },
		"SetVMConfig": func() {
			must("SetVMConfig", api.SetVMConfig(ctx, "pve1", vmid, proxmox.ConfigUpdate{
				Set: map[string]string{"cores": "2", "memory": "2048", "agent": "1", "onboot": "1", "tags": "egressproxy;ep-u-x;ep-i-y",
					"ide2": "local:iso/egressproxy-pt-endpoints-0123456789ab.iso,media=cdrom", "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=20",
					"description": "a\nb"},
				Delete: []string{"serial0"},
			}))
		},
		"Clone": func() {
			var err error
			upid, err = api.Clone(ctx, "pve1", 9000, proxmox.CloneParams{NewID: 100123, Name: "pt-clone", Description: "x", Full: true})
			must("Clone", err)
		},
		"Resize":          func() { _, err := api.Resize(ctx, "pve1", vmid, "scsi0", "10G"); must("Resize", err) },
		"Start":           func() { _, err := api.Start(ctx, "pve1", 100123); must("Start", err) },
		"Reboot":          func() { _, err := api.Reboot(ctx, "pve1", vmid); must("Reboot", err) },
		"Stop":            func() { _, err := api.Stop(ctx, "pve1", 100123); must("Stop", err) },
		"Destroy":         func() { _, err := api.Destroy(ctx, "pve1", 100123); must("Destroy", err) },
		"VMStatus":        func() { _, err := api.VMStatus(ctx, "pve1", vmid); must("VMStatus", err) },
		"AgentInterfaces": func() { _, err := api.AgentInterfaces(ctx, "pve1", vmid); must("AgentInterfaces", err) },
		"AgentFileRead": func() {
			fake.SetGuestFile(vmid, "/var/lib/egressproxy/egress-check.report", "a line\n")
			c, _, err := api.AgentFileRead(ctx, "pve1", vmid, "/var/lib/egressproxy/egress-check.report")
			must("AgentFileRead", err)
			if c != "a line\n" {
				t.Errorf("AgentFileRead = %q", c)
			}
		},
		"TaskLog": func() { _, err := api.TaskLog(ctx, "pve1", upid); must("TaskLog", err) },
		"Tasks":   func() { _, err := api.Tasks(ctx, "pve1", vmid); must("Tasks", err) },
	}
	// Every method of the seam is called here, and nothing else exists.
	var methods []string
	it := reflect.TypeFor[proxmox.API]()
	for i := range it.NumMethod() {
		methods = append(methods, it.Method(i).Name)
	}
	var called []string
	for name := range calls {
		called = append(called, name)
	}
	sort.Strings(called)
	if diff := cmp.Diff(methods, called); diff != "" {
		t.Fatalf("methods of API vs methods this test calls (-API +test):\n%s", diff)
	}
	order := []string{"Version", "Resources", "NodeStatus", "NodeNetwork", "StorageStatus", "Upload", "ISOs", "DeleteVolume", "VMConfig",
		"SetVMConfig", "AgentInterfaces", "AgentFileRead", "VMStatus", "Resize", "Clone", "Start", "Reboot", "Stop", "Tasks", "TaskLog", "Destroy"}
	want := map[string]string{
		"Version": "GET /version", "Resources": "GET /cluster/resources", "NodeStatus": "GET /nodes/{node}/status",
		"NodeNetwork":   "GET /nodes/{node}/network",
		"StorageStatus": "GET /nodes/{node}/storage/{storage}/status", "ISOs": "GET /nodes/{node}/storage/{storage}/content",
		"Upload": "POST /nodes/{node}/storage/{storage}/upload", "DeleteVolume": "DELETE /nodes/{node}/storage/{storage}/content/{volume}",
		"VMConfig": "GET /nodes/{node}/qemu/{vmid}/config", "SetVMConfig": "PUT /nodes/{node}/qemu/{vmid}/config",
		"Clone": "POST /nodes/{node}/qemu/{vmid}/clone", "Resize": "PUT /nodes/{node}/qemu/{vmid}/resize",
		"Start": "POST /nodes/{node}/qemu/{vmid}/status/start", "Stop": "POST /nodes/{node}/qemu/{vmid}/status/stop",
		"Reboot": "POST /nodes/{node}/qemu/{vmid}/status/reboot", "Destroy": "DELETE /nodes/{node}/qemu/{vmid}",
		"VMStatus": "GET /nodes/{node}/qemu/{vmid}/status/current", "AgentInterfaces": "GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
		"AgentFileRead": "GET /nodes/{node}/qemu/{vmid}/agent/file-read",
		"TaskLog":       "GET /nodes/{node}/tasks/{upid}/log", "Tasks": "GET /nodes/{node}/tasks",
	}
	if len(order) != len(calls) {
		t.Fatalf("order lists %d calls; want %d", len(order), len(calls))
	}
	schema, err := pvetest.LoadSchema()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range order {
		fake.ResetRequests()
		fake.FinishTasks()
		mu.Lock()
		nLines := len(lines)
		mu.Unlock()
		nSpans := len(rec.Ended())
		calls[name]()
		reqs := fake.Requests()
		if len(reqs) != 1 || reqs[0].Endpoint != want[name] || reqs[0].Status != 200 {
			t.Errorf("%s sent %+v; want one successful %s", name, reqs, want[name])
		}
		if !slices.Contains(schema.Methods(), want[name]) {
			t.Errorf("%s: %s is not in the schema", name, want[name])
		}
		mu.Lock()
		got := lines[nLines:]
		mu.Unlock()
		if len(got) != 1 || !strings.Contains(got[0], `"call"="`+name) {
			t.Errorf("%s logged %q; want one proxmox api call line", name, got)
		}
		spans := rec.Ended()[nSpans:]
		if len(spans) != 1 || spans[0].Name() != "proxmox."+name && !strings.HasPrefix(spans[0].Name(), "proxmox."+name+"(") {
			t.Errorf("%s made spans %v; want one proxmox.%s", name, spans, name)
		}
	}
	for _, l := range lines {
		if strings.Contains(l, fake.Token()[len("egress@pve!provider="):]) {
			t.Errorf("a call line leaks the token: %s", l)
		}
	}
}
