// Package packages_test builds the project's three Crossplane packages with
// hack/xpkg.sh (`crossplane xpkg build` of the Crossplane CLI, built from
// the Go module proxy) and opens each .xpkg, as Crossplane's package
// manager would, to check what is inside: the metadata, every object, the
// examples, the runtime image of each architecture.
package packages_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

const (
	version = "v0.0.0-test"
	// repo is the registry and organisation the Configuration is told.
	repo = "registry.test.example/acme"
)

// pkg is an opened .xpkg: an OCI image tarball.
type pkg struct {
	// objects of package.yaml (the layer labelled base), meta first.
	objects []*unstructured.Unstructured
	// examples are the objects of the examples layer, if any.
	examples []*unstructured.Unstructured
	// files of the other layers (the runtime image), by path.
	files map[string][]byte
	// config is the image configuration.
	config struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
		Config       struct {
			Entrypoint []string          `json:"Entrypoint"`
			User       string            `json:"User"`
			Env        []string          `json:"Env"`
			Labels     map[string]string `json:"Labels"`
		} `json:"config"`
	}
	size int64
}

func open(t *testing.T, path string) *pkg {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	entries := untar(t, path, false)
	var manifest []struct {
		Config string   `json:"Config"`
		Layers []string `json:"Layers"`
	}
	if err := json.Unmarshal(entries["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("%s: manifest.json %q: %v", path, entries["manifest.json"], err)
	}
	p := &pkg{files: map[string][]byte{}, size: fi.Size()}
	if err := json.Unmarshal(entries[manifest[0].Config], &p.config); err != nil {
		t.Fatalf("%s: image config: %v", path, err)
	}
	for _, l := range manifest[0].Layers {
		digest := "sha256:" + strings.TrimSuffix(l, ".tar.gz")
		files := untarBytes(t, entries[l], true)
		switch p.config.Config.Labels["io.crossplane.xpkg:"+digest] {
		case "base":
			p.objects = decode(t, files["package.yaml"])
		case "upbound":
			p.examples = decode(t, files[".up/examples.yaml"])
			if len(p.examples) == 0 {
				for name, b := range files {
					if strings.HasSuffix(name, ".yaml") {
						p.examples = append(p.examples, decode(t, b)...)
					}
				}
			}
		default:
			for n, b := range files {
				p.files[n] = b
			}
		}
	}
	if len(p.objects) == 0 {
		t.Fatalf("%s has no package.yaml in a layer labelled io.crossplane.xpkg=base; labels %v", path, p.config.Config.Labels)
	}
	return p
}

func untar(t *testing.T, path string, gz bool) map[string][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return untarBytes(t, b, gz)
}

func untarBytes(t *testing.T, b []byte, gz bool) map[string][]byte {
	t.Helper()
	var r io.Reader = bytes.NewReader(b)
	if gz {
		z, err := gzip.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		r = z
	}
	out := map[string][]byte{}
	testenv.EachTarEntry(t, r, func(h *tar.Header, content io.Reader) {
		if h.Typeflag != tar.TypeReg {
			return
		}
		data, err := io.ReadAll(content)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(h.Name, "/")] = data
	})
	return out
}

func decode(t *testing.T, b []byte) []*unstructured.Unstructured {
	t.Helper()
	objs, err := localcrossplane.DecodeYAML(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// kinds lists "apiVersion kind name" of objects, sorted.
func kinds(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, fmt.Sprintf("%s %s %s", o.GetAPIVersion(), o.GetKind(), o.GetName()))
	}
	sort.Strings(out)
	return out
}

// build runs hack/xpkg.sh once for all the tests; out is its folder.
func build(t *testing.T) (pkgs map[string]*pkg, out string) {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out = t.TempDir()
	cmd := exec.Command("bash", filepath.Join(root, "hack", "xpkg.sh"), out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "VERSION="+version, "XPKG_REPO="+repo)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/xpkg.sh: %v\n%s", err, b)
	}
	t.Logf("hack/xpkg.sh:\n%s", b)
	pkgs = map[string]*pkg{"configuration": open(t, filepath.Join(out, "configuration-egressproxy-"+version+".xpkg"))}
	for _, n := range []string{"provider", "function"} {
		for _, arch := range []string{"amd64", "arm64"} {
			pkgs[n+"-"+arch] = open(t, filepath.Join(out, n+"-egressproxy-"+version+"-"+arch+".xpkg"))
		}
		pkgs[n] = pkgs[n+"-amd64"]
	}
	return pkgs, out
}

// TestPackagesIntegration opens the three packages make xpkg builds.
func TestPackagesIntegration(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	pkgs, out := build(t)

	t.Run("Provider", func(t *testing.T) {
		p := pkgs["provider"]
		meta := p.objects[0]
		if meta.GetAPIVersion() != "meta.pkg.crossplane.io/v1" || meta.GetKind() != "Provider" || meta.GetName() != "provider-egressproxy" {
			t.Errorf("meta = %s %s %s; want meta.pkg.crossplane.io/v1 Provider provider-egressproxy", meta.GetAPIVersion(), meta.GetKind(), meta.GetName())
		}
		// The v1 CLI drops this; Crossplane v2 needs it to activate the
		// provider's MRDs.
		if caps, _, _ := unstructured.NestedStringSlice(meta.Object, "spec", "capabilities"); !slices.Contains(caps, "safe-start") {
			t.Errorf("spec.capabilities = %v; want safe-start", caps)
		}
		// The Crossplane versions it supports, as the function and the
		// Configuration state them.
		if v, _, _ := unstructured.NestedString(meta.Object, "spec", "crossplane", "version"); v != ">=v2.0.0-0" {
			t.Errorf("spec.crossplane.version = %q; want >=v2.0.0-0", v)
		}
		// Every definition of package/crds: the proxy kinds as MRDs, the
		// ProviderConfig kinds as CRDs (which Crossplane keeps as they are).
		var want []string
		crds, _ := filepath.Glob(filepath.Join(root, "package", "crds", "*.yaml"))
		for _, f := range crds {
			// controller-gen names the files <group>_<plural>.yaml.
			group, plural, _ := strings.Cut(strings.TrimSuffix(filepath.Base(f), ".yaml"), "_")
			if strings.HasPrefix(group, "proxy.") {
				want = append(want, "apiextensions.crossplane.io/v1alpha1 ManagedResourceDefinition "+plural+"."+group)
			} else {
				want = append(want, "apiextensions.k8s.io/v1 CustomResourceDefinition "+plural+"."+group)
			}
		}
		sort.Strings(want)
		if got := kinds(p.objects[1:]); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("provider objects:\n%s\nwant every definition of package/crds:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		// Each MRD states the connection Secret's keys.
		for _, o := range p.objects[1:] {
			if o.GetKind() != "ManagedResourceDefinition" {
				continue
			}
			if got := connectionKeys(o); !slices.Equal(got, v1alpha1.ConnectionKeys) {
				t.Errorf("MRD %s: spec.connectionDetails names %v; want %v", o.GetName(), got, v1alpha1.ConnectionKeys)
			}
		}
		if len(p.examples) == 0 {
			t.Error("no examples layer (examples/)")
		}
		if img, _, _ := unstructured.NestedString(meta.Object, "spec", "controller", "image"); img != "" {
			t.Errorf("spec.controller.image = %q; Crossplane v2 runs the package's own runtime image", img)
		}
		checkRuntime(t, pkgs["provider-amd64"], "provider", "amd64")
		checkRuntime(t, pkgs["provider-arm64"], "provider", "arm64")
	})

	// The PodProxy grant for this registry: its ImageConfig gives the
	// provider of XPKG_REPO the runtime config with the grant.
	t.Run("PodProxyGrant", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(out, "podproxy.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for _, o := range decode(t, b) {
			if o.GetKind() != "ImageConfig" {
				continue
			}
			found = true
			m, _, _ := unstructured.NestedSlice(o.Object, "spec", "matchImages")
			rc, _, _ := unstructured.NestedString(o.Object, "spec", "runtime", "configRef", "name")
			if fmt.Sprint(m) != "[map[prefix:"+repo+"/provider-egressproxy type:Prefix]]" || rc != "provider-egressproxy" {
				t.Errorf("ImageConfig %s: matchImages %v, runtime config %q; want the prefix %s/provider-egressproxy and provider-egressproxy", o.GetName(), m, rc, repo)
			}
		}
		if !found {
			t.Error("bin/xpkg/podproxy.yaml holds no ImageConfig")
		}
	})

	t.Run("Configuration", func(t *testing.T) {
		p := pkgs["configuration"]
		meta := p.objects[0]
		if meta.GetKind() != "Configuration" || meta.GetName() != "configuration-egressproxy" {
			t.Errorf("meta = %s %s", meta.GetKind(), meta.GetName())
		}
		deps, _, _ := unstructured.NestedSlice(meta.Object, "spec", "dependsOn")
		var got []string
		for _, d := range deps {
			m, _ := d.(map[string]any)
			got = append(got, fmt.Sprintf("%v %v %v %v", m["apiVersion"], m["kind"], m["package"], m["version"]))
		}
		// The registry make xpkg is told, and a constraint that admits the
		// pre-releases built between tags; apiVersion, kind and package,
		// not the provider: and function: keys Crossplane deprecates.
		wantDeps := []string{"pkg.crossplane.io/v1 Provider " + repo + "/provider-egressproxy >=v0.2.0-0", "pkg.crossplane.io/v1 Function " + repo + "/function-egressproxy >=v0.2.0-0"}
		if strings.Join(got, "; ") != strings.Join(wantDeps, "; ") {
			t.Errorf("dependsOn = %v; want %v", got, wantDeps)
		}
		wantObjs := []string{
			"apiextensions.crossplane.io/v1 Composition egressproxies.platform.egressproxy.io",
			"apiextensions.crossplane.io/v1 Composition xegressproxies.legacy.platform.egressproxy.io",
			"apiextensions.crossplane.io/v1 CompositeResourceDefinition xegressproxies.legacy.platform.egressproxy.io",
			"apiextensions.crossplane.io/v2 CompositeResourceDefinition egressproxies.platform.egressproxy.io",
		}
		sort.Strings(wantObjs)
		if got := kinds(p.objects[1:]); strings.Join(got, "\n") != strings.Join(wantObjs, "\n") {
			t.Errorf("configuration objects:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantObjs, "\n"))
		}
		for _, o := range p.objects[1:] {
			switch o.GetKind() {
			case "CompositeResourceDefinition":
				if o.GetAPIVersion() == "apiextensions.crossplane.io/v2" {
					if s, _, _ := unstructured.NestedString(o.Object, "spec", "scope"); s != "Namespaced" {
						t.Errorf("%s: scope %q; want Namespaced", o.GetName(), s)
					}
				} else if k, _, _ := unstructured.NestedString(o.Object, "spec", "claimNames", "kind"); k != "EgressProxyClaim" {
					t.Errorf("%s: claimNames.kind %q; want EgressProxyClaim", o.GetName(), k)
				}
			case "Composition":
				steps, _, _ := unstructured.NestedSlice(o.Object, "spec", "pipeline")
				mode, _, _ := unstructured.NestedString(o.Object, "spec", "mode")
				if mode != "Pipeline" || len(steps) != 1 {
					t.Errorf("%s: mode %q, %d steps; want one Pipeline step", o.GetName(), mode, len(steps))
					continue
				}
				step, _ := steps[0].(map[string]any)
				fn, _, _ := unstructured.NestedString(step, "functionRef", "name")
				in, _, _ := unstructured.NestedMap(step, "input")
				classes, _, _ := unstructured.NestedMap(in, "classes")
				var backends []string
				for _, c := range classes {
					k, _, _ := unstructured.NestedString(c.(map[string]any), "kind") //nolint:forcetypeassert // a YAML map.
					backends = append(backends, k)
				}
				sort.Strings(backends)
				// The name Crossplane's dependency resolver gives the
				// dependency (crossplane-runtime's xpkg.ToDNSLabel of
				// acme/function-egressproxy, the repository without the
				// registry host); test/install installs the Configuration
				// alone on real core and its claims need it.
				const wantFn = "acme-function-egressproxy"
				if fn != wantFn || in["kind"] != "ProxyClasses" || strings.Join(backends, ",") != "GCPProxy,KVMProxy,PodProxy,ProxmoxProxy" {
					t.Errorf("%s: function %q, input kind %v, backends %v; want %s, ProxyClasses, a class for every backend", o.GetName(), fn, in["kind"], backends, wantFn)
				}
			}
		}
		if got := kinds(p.examples); len(got) != 2 {
			t.Errorf("examples %v; want an EgressProxy and an EgressProxyClaim", got)
		}
		if len(p.files) != 0 {
			t.Errorf("a Configuration has no runtime, but the package holds %d files", len(p.files))
		}
	})

	t.Run("Function", func(t *testing.T) {
		p := pkgs["function"]
		meta := p.objects[0]
		if meta.GetAPIVersion() != "meta.pkg.crossplane.io/v1" || meta.GetKind() != "Function" || meta.GetName() != "function-egressproxy" {
			t.Errorf("meta = %s %s %s; want meta.pkg.crossplane.io/v1 Function function-egressproxy", meta.GetAPIVersion(), meta.GetKind(), meta.GetName())
		}
		if caps, _, _ := unstructured.NestedStringSlice(meta.Object, "spec", "capabilities"); !slices.Equal(caps, []string{"composition"}) {
			t.Errorf("spec.capabilities = %v; want [composition]", caps)
		}
		if got := kinds(p.objects[1:]); len(got) != 1 || got[0] != "apiextensions.k8s.io/v1 CustomResourceDefinition proxyclasses.function.egressproxy.io" {
			t.Errorf("function objects %v; want the ProxyClasses input CRD", got)
		}
		checkRuntime(t, pkgs["function-amd64"], "function-egressproxy", "amd64")
		checkRuntime(t, pkgs["function-arm64"], "function-egressproxy", "arm64")
	})

	for _, n := range []string{"provider-amd64", "provider-arm64", "function-amd64", "function-arm64", "configuration"} {
		p := pkgs[n]
		t.Logf("FIGURE %s package: %d bytes (%.1f MiB)", n, p.size, float64(p.size)/(1<<20))
	}
}

// TestPackagesRefuseBadInputIntegration: make xpkg says what is wrong with
// its input before it builds anything.
func TestPackagesRefuseBadInputIntegration(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	run := func(env []string, script string, args ...string) string {
		cmd := exec.Command("bash", append([]string{filepath.Join(root, "hack", script)}, args...)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		b, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("hack/%s %v with %v: no error\n%s", script, args, env, b)
		}
		return string(b)
	}
	if out := run([]string{"VERSION=1.2"}, "xpkg.sh", t.TempDir()); !strings.Contains(out, "VERSION=1.2 is not a semantic version") {
		t.Errorf("VERSION=1.2: %s", out)
	}
	if out := run([]string{"VERSION=v1.0.0", "XPKG_REPO=https://x"}, "xpkg.sh", t.TempDir()); !strings.Contains(out, "XPKG_REPO=https://x: want registry/organisation") {
		t.Errorf("XPKG_REPO=https://x: %s", out)
	}
	// Stale CRDs: one edited by hand, one missing.
	crds := t.TempDir()
	files, _ := filepath.Glob(filepath.Join(root, "package", "crds", "*.yaml"))
	for i, f := range files {
		if i == 0 {
			continue
		}
		b, _ := os.ReadFile(f)
		if i == 1 {
			b = append(b, []byte("# edited by hand\n")...)
		}
		if err := os.WriteFile(filepath.Join(crds, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := run(nil, "check-crds.sh", crds)
	if !strings.Contains(out, "is stale") || !strings.Contains(out, filepath.Base(files[1])+" differ") ||
		!strings.Contains(out, "missing: "+filepath.Base(files[0])) || !strings.Contains(out, "make generate") {
		t.Errorf("stale CRDs: %s", out)
	}
}

// checkRuntime: the runtime image runs the static binary of its
// architecture as non-root, with Debian's CA certificates and nothing else.
func checkRuntime(t *testing.T, p *pkg, bin, arch string) {
	t.Helper()
	if p.config.Architecture != arch {
		t.Errorf("runtime image architecture %q, want %s", p.config.Architecture, arch)
	}
	// ELF e_machine: 0x3e x86-64, 0xb7 AArch64.
	if b := p.files["usr/local/bin/"+bin]; len(b) > 20 && map[string]byte{"amd64": 0x3e, "arm64": 0xb7}[arch] != b[18] {
		t.Errorf("usr/local/bin/%s is for ELF machine %#x, not %s", bin, b[18], arch)
	}
	var files []string
	for f := range p.files {
		files = append(files, f)
	}
	sort.Strings(files)
	want := []string{"etc/group", "etc/passwd", "etc/ssl/certs/ca-certificates.crt", "usr/local/bin/" + bin}
	if strings.Join(files, " ") != strings.Join(want, " ") {
		t.Errorf("runtime image files %v; want only %v", files, want)
	}
	if ca := p.files["etc/ssl/certs/ca-certificates.crt"]; bytes.Count(ca, []byte("BEGIN CERTIFICATE")) < 100 {
		t.Errorf("CA bundle holds %d certificates; want Debian's (over 100)", bytes.Count(ca, []byte("BEGIN CERTIFICATE")))
	}
	if !strings.Contains(string(p.files["etc/passwd"]), "nonroot:x:65532:65532") {
		t.Errorf("/etc/passwd has no nonroot user: %q", p.files["etc/passwd"])
	}
	path := "usr/local/bin/" + bin
	b := p.files[path]
	if len(b) < 1<<20 || !bytes.HasPrefix(b, []byte("\x7fELF")) {
		t.Errorf("runtime image: %s is %d bytes; want the ELF binary", path, len(b))
	}
	c := p.config
	if strings.Join(c.Config.Entrypoint, " ") != "/"+path || c.OS != "linux" || c.Config.User == "" || strings.HasPrefix(c.Config.User, "0") {
		t.Errorf("runtime image config: entrypoint %v, os %q, user %q; want /%s on linux as non-root", c.Config.Entrypoint, c.OS, c.Config.User, path)
	}
}

// connectionKeys are the names in an MRD's spec.connectionDetails.
func connectionKeys(o *unstructured.Unstructured) []string {
	details, _, _ := unstructured.NestedSlice(o.Object, "spec", "connectionDetails")
	var out []string
	for _, d := range details {
		m, _ := d.(map[string]any)
		if desc, _ := m["description"].(string); desc == "" {
			continue
		}
		n, _ := m["name"].(string)
		out = append(out, n)
	}
	return out
}

// TestReleaseConfigurationIntegration builds the Configuration of a
// release version (PLATFORMS=none: the Configuration alone): it depends
// on the provider and the function of at least that version, by a
// constraint that admits no pre-release.
func TestReleaseConfigurationIntegration(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command("bash", filepath.Join(root, "hack", "xpkg.sh"), out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "VERSION=v0.3.0", "XPKG_REPO="+repo, "PLATFORMS=none")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/xpkg.sh: %v\n%s", err, b)
	}
	if m, _ := filepath.Glob(filepath.Join(out, "*-egressproxy-*-*.xpkg")); len(m) != 0 {
		t.Errorf("PLATFORMS=none built %v; want the Configuration only", m)
	}
	meta := open(t, filepath.Join(out, "configuration-egressproxy-v0.3.0.xpkg")).objects[0]
	deps, _, _ := unstructured.NestedSlice(meta.Object, "spec", "dependsOn")
	var got []string
	for _, d := range deps {
		m, _ := d.(map[string]any)
		got = append(got, fmt.Sprintf("%v %v", m["package"], m["version"]))
	}
	want := []string{repo + "/provider-egressproxy >=v0.3.0", repo + "/function-egressproxy >=v0.3.0"}
	if !slices.Equal(got, want) {
		t.Errorf("dependsOn of the release v0.3.0: %v; want %v", got, want)
	}
}
