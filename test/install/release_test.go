package install_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// releaseArtefacts checks what make release (hack/release.sh) wrote for
// version into dir besides the packages: SHA256SUMS that sha256sum -c
// accepts and that covers every artefact, a CycloneDX SBOM of the provider
// per architecture naming the modules it is built from, the application
// teams' roles as root's cluster/rbac holds them, and the CHANGELOG entry.
func releaseArtefacts(t *testing.T, root, dir, version, repo string) {
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sha256sum", "-c", "SHA256SUMS")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c SHA256SUMS: %v\n%s", err, out)
	}
	var listed []string
	for _, l := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			listed = append(listed, f[1])
		}
	}
	want := []string{"CHANGELOG-" + version + ".md", "configuration-egressproxy-" + version + ".xpkg", "podproxy.yaml", "tenant.yaml", "squid-egressproxy-" + version + ".oci.tar"}
	for _, arch := range []string{"amd64", "arm64"} {
		want = append(want, "function-egressproxy-"+version+"-"+arch+".xpkg", "provider-egressproxy-"+version+"-"+arch+".cdx.json", "provider-egressproxy-"+version+"-"+arch+".xpkg")
	}
	slices.Sort(want)
	slices.Sort(listed)
	if !slices.Equal(listed, want) {
		t.Errorf("SHA256SUMS lists %v; want %v", listed, want)
	}

	for _, arch := range []string{"amd64", "arm64"} {
		b, err := os.ReadFile(filepath.Join(dir, "provider-egressproxy-"+version+"-"+arch+".cdx.json"))
		if err != nil {
			t.Fatal(err)
		}
		var bom struct {
			BOMFormat string `json:"bomFormat"`
			Metadata  struct {
				Component struct {
					Name, Version string
				} `json:"component"`
			} `json:"metadata"`
			Components []struct {
				Name, Version string
			} `json:"components"`
		}
		if err := json.Unmarshal(b, &bom); err != nil {
			t.Fatalf("SBOM %s: %v", arch, err)
		}
		var names []string
		for _, c := range bom.Components {
			names = append(names, c.Name)
		}
		if bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Version != version ||
			!slices.Contains(names, "github.com/crossplane/crossplane-runtime/v2") || !slices.Contains(names, "k8s.io/client-go") {
			t.Errorf("SBOM %s: format %q, component %s %s, %d components (%v...); want CycloneDX of the provider %s naming crossplane-runtime and client-go",
				arch, bom.BOMFormat, bom.Metadata.Component.Name, bom.Metadata.Component.Version, len(names), names[:min(5, len(names))], version)
		}
	}

	// The application teams' roles, as the repository holds them.
	shipped, err := os.ReadFile(filepath.Join(dir, "tenant.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if src, err := os.ReadFile(filepath.Join(root, "cluster", "rbac", "tenant.yaml")); err != nil || !bytes.Equal(shipped, src) {
		t.Errorf("tenant.yaml of the release differs from cluster/rbac/tenant.yaml (%v)", err)
	}

	cl, err := os.ReadFile(filepath.Join(dir, "CHANGELOG-"+version+".md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(cl), "## "+version+" (") || !strings.Contains(string(cl), "\n- ") {
		t.Errorf("CHANGELOG-%s.md:\n%s\nwant a heading for %s and the commits", version, cl, version)
	}
	grant, err := os.ReadFile(filepath.Join(dir, "podproxy.yaml"))
	if err != nil || !strings.Contains(string(grant), "prefix: "+repo+"/provider-egressproxy\n") {
		t.Errorf("podproxy.yaml names no ImageConfig prefix %s/provider-egressproxy (%v)", repo, err)
	}
}
