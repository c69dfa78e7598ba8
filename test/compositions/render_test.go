package compositions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/function-sdk-go/logging"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/egressproxy/provider-egressproxy/function"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	xpt "github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane/crossplanetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// annotationResourceName names a composed resource within its composite.
const annotationResourceName = "crossplane.io/composition-resource-name"

// renderMatchesCore runs the render kit (package/render) with the
// Crossplane CLI the project builds, `crossplane render` on Crossplane
// core v2.4.0's own engine (--crossplane-binary) and the function on the
// Development runtime, for the kit's XR and one of every other class; and
// creates the same XRs on the real core of this test. Every composed
// resource render prints must be what core composed: the same kind under
// the same composition resource name, every field of its spec and labels
// the same (core's object also holds what the API server defaults).
func renderMatchesCore(t *testing.T, kube client.Client) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cli := xpt.Script(t, root, nil, "crossplane-bins.sh", "cli")
	core := filepath.Join(xpt.Script(t, root, nil, "crossplane-bins.sh"), "crossplane")
	target := serveInsecure(t)
	dir := t.TempDir()
	fns, err := os.ReadFile(filepath.Join(root, "package", "render", "functions.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(fns), "runtime-development-target: localhost:9443") {
		t.Fatal("package/render/functions.yaml no longer targets localhost:9443")
	}
	fnFile := filepath.Join(dir, "functions.yaml")
	if err := os.WriteFile(fnFile, []byte(strings.ReplaceAll(string(fns), "localhost:9443", target)), 0o600); err != nil {
		t.Fatal(err)
	}
	kit, err := os.ReadFile(filepath.Join(root, "package", "render", "xr.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	base := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(kit, &base.Object); err != nil {
		t.Fatal(err)
	}

	kinds := map[string]string{"standard": "PodProxy", "dedicated": "KVMProxy", "datacenter": "ProxmoxProxy", "cloud": "GCPProxy"}
	classes := make([]string, 0, len(kinds))
	for c := range kinds {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	for _, class := range classes {
		t.Run(class, func(t *testing.T) {
			xr := base.DeepCopy()
			xr.SetNamespace("team-c")
			xr.SetName("render-" + class)
			_ = unstructured.SetNestedField(xr.Object, class, "spec", "class")
			b, err := yaml.Marshal(xr.Object)
			if err != nil {
				t.Fatal(err)
			}
			xrFile := filepath.Join(dir, class+".yaml")
			if err := os.WriteFile(xrFile, b, 0o600); err != nil {
				t.Fatal(err)
			}
			// What render says.
			cmd := exec.Command(cli, "render", xrFile, filepath.Join(root, "package", "configuration", "composition-namespaced.yaml"), fnFile, //nolint:gosec // the CLI we built.
				"--xrd="+filepath.Join(root, "package", "configuration", "xrd-namespaced.yaml"), "--crossplane-binary="+core, "--timeout=30s")
			out, err := cmd.Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok { //nolint:errorlint // exec returns it unwrapped.
					stderr = ee.Stderr
				}
				t.Fatalf("crossplane render: %v\n%s", err, stderr)
			}
			docs, err := localcrossplane.DecodeYAML(string(out))
			if err != nil {
				t.Fatalf("crossplane render printed what does not decode: %v\n%s", err, out)
			}
			rendered := map[string]*unstructured.Unstructured{}
			for _, o := range docs[1:] { // the XR first
				if o.GetKind() == "Result" {
					continue
				}
				rendered[o.GetAnnotations()[annotationResourceName]] = o
			}
			if len(rendered) == 0 {
				t.Fatalf("crossplane render composed nothing:\n%s", out)
			}

			// What core composes.
			live := xr.DeepCopy()
			if err := kube.Create(context.Background(), live); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = kube.Delete(context.Background(), live) })
			composed := map[string]*unstructured.Unstructured{}
			testenv.WaitFor(t, "core to compose the resources of "+xr.GetName(), 2*time.Minute, func() (bool, string) {
				if err := kube.Get(context.Background(), client.ObjectKeyFromObject(live), live); err != nil {
					return false, err.Error()
				}
				refs, _, _ := unstructured.NestedSlice(live.Object, "spec", "crossplane", "resourceRefs")
				for _, r := range refs {
					m, _ := r.(map[string]any)
					o := &unstructured.Unstructured{}
					o.SetAPIVersion(fmt.Sprint(m["apiVersion"]))
					o.SetKind(fmt.Sprint(m["kind"]))
					o.SetNamespace(live.GetNamespace())
					o.SetName(fmt.Sprint(m["name"]))
					if err := kube.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
						return false, err.Error()
					}
					composed[o.GetAnnotations()[annotationResourceName]] = o
				}
				return len(composed) >= len(rendered), fmt.Sprintf("resourceRefs %v", refs)
			})

			var mr string
			for name, want := range rendered {
				got, ok := composed[name]
				if !ok {
					t.Errorf("render composes %s %q; core does not (core: %v)", want.GetKind(), name, keys(composed))
					continue
				}
				if got.GetAPIVersion() != want.GetAPIVersion() || got.GetKind() != want.GetKind() {
					t.Errorf("%q: render %s %s, core %s %s", name, want.GetAPIVersion(), want.GetKind(), got.GetAPIVersion(), got.GetKind())
				}
				for _, f := range []string{"spec", "metadata.labels"} {
					path := strings.Split(f, ".")
					w, _, _ := unstructured.NestedFieldNoCopy(want.Object, path...)
					g, _, _ := unstructured.NestedFieldNoCopy(got.Object, path...)
					for _, d := range subset(f, jsonValue(t, w), jsonValue(t, g)) {
						t.Errorf("%s %q: %s", want.GetKind(), name, d)
					}
				}
				if want.GetKind() == kinds[class] {
					mr = name
				}
			}
			if mr == "" {
				t.Errorf("render composes %v; want a %s for class %s", keys(rendered), kinds[class], class)
			}
			t.Logf("class %s: render and core compose the same %v", class, keys(rendered))
		})
	}
}

// subset lists where want (what render printed) differs from got (core's
// object): every field of want must be in got with the same value; lists
// must be equal.
func subset(path string, want, got any) []string {
	wm, ok := want.(map[string]any)
	if !ok {
		if !reflect.DeepEqual(want, got) {
			return []string{fmt.Sprintf("%s: render %v, core %v", path, want, got)}
		}
		return nil
	}
	gm, ok := got.(map[string]any)
	if !ok {
		return []string{fmt.Sprintf("%s: render %v, core %v", path, want, got)}
	}
	var out []string
	for k, v := range wm {
		out = append(out, subset(path+"."+k, v, gm[k])...)
	}
	sort.Strings(out)
	return out
}

// jsonValue is v as encoding/json decodes it, so that numbers compare
// alike whichever decoder read them (YAML's int64, JSON's float64).
func jsonValue(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func keys(m map[string]*unstructured.Unstructured) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// serveInsecure runs the function without TLS on a loopback port, as
// `function-egressproxy --insecure` does for render's Development runtime,
// and returns its address.
func serveInsecure(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fnv1.RegisterFunctionRunnerServiceServer(srv, function.New(logging.NewNopLogger()))
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return l.Addr().String()
}
