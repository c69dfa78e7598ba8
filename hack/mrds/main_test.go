package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// TestDefinitions converts the repository's own package/crds: each proxy
// kind becomes an MRD naming every connection key with a description and
// keeping the CRD's schema; the ProviderConfig kinds stay as they are.
func TestDefinitions(t *testing.T) {
	files, _ := filepath.Glob("../../package/crds/*.yaml")
	if len(files) < 13 {
		t.Fatalf("package/crds holds %d files", len(files))
	}
	out := t.TempDir()
	if err := run(out, files); err != nil {
		t.Fatal(err)
	}
	mrds := 0
	for _, f := range files {
		in, _ := os.ReadFile(f)
		got, err := os.ReadFile(filepath.Join(out, filepath.Base(f)))
		if err != nil {
			t.Fatal(err)
		}
		var crd, o map[string]any
		if err := yaml.Unmarshal(in, &crd); err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(got, &o); err != nil {
			t.Fatal(err)
		}
		kind := crd["spec"].(map[string]any)["names"].(map[string]any)["kind"].(string) //nolint:forcetypeassert // a CRD.
		if notManaged[kind] {
			if string(got) != string(in) {
				t.Errorf("%s (%s) changed; want the CRD as it is", f, kind)
			}
			continue
		}
		mrds++
		if o["apiVersion"] != "apiextensions.crossplane.io/v1alpha1" || o["kind"] != "ManagedResourceDefinition" {
			t.Errorf("%s: %v %v; want an MRD", f, o["apiVersion"], o["kind"])
		}
		spec := o["spec"].(map[string]any) //nolint:forcetypeassert // written above.
		var names []string
		for _, d := range spec["connectionDetails"].([]any) { //nolint:forcetypeassert // written above.
			m := d.(map[string]any) //nolint:forcetypeassert // written above.
			if m["description"] == "" {
				t.Errorf("%s: key %v has no description", f, m["name"])
			}
			names = append(names, m["name"].(string)) //nolint:forcetypeassert // written above.
		}
		if !slices.Equal(names, v1alpha1.ConnectionKeys) {
			t.Errorf("%s: connection keys %v; want %v", f, names, v1alpha1.ConnectionKeys)
		}
		delete(spec, "connectionDetails")
		if a, b := mustJSON(t, spec), mustJSON(t, crd["spec"]); a != b {
			t.Errorf("%s: the MRD's spec is not the CRD's", f)
		}
		if _, ok := spec["state"]; ok {
			t.Errorf("%s: the MRD sets a state; want Crossplane's default (Inactive until a policy activates it)", f)
		}
	}
	if mrds != 8 {
		t.Errorf("%d MRDs; want one per proxy kind and scope (8)", mrds)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
