package function

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// crdLike is what a CRD and an XRD share: a name, versions with a schema,
// and, for an XRD, the Composition it enforces.
type crdLike struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		DefaultCompositionRef  *struct{ Name string } `json:"defaultCompositionRef"`
		EnforcedCompositionRef *struct{ Name string } `json:"enforcedCompositionRef"`
		Versions               []struct {
			Schema struct {
				OpenAPIV3Schema apiextv1.JSONSchemaProps `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

func load(t *testing.T, path string) crdLike {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c crdLike
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(c.Spec.Versions) != 1 {
		t.Fatalf("%s: %d versions; the test reads one", path, len(c.Spec.Versions))
	}
	return c
}

// norm makes rules written over several lines comparable.
func norm(rule string) string { return strings.Join(strings.Fields(rule), " ") }

func rules(s apiextv1.JSONSchemaProps, fieldPath string) []string {
	var out []string
	for _, r := range s.XValidations {
		if r.FieldPath == fieldPath {
			out = append(out, norm(r.Rule))
		}
	}
	return out
}

func itemRules(s apiextv1.JSONSchemaProps) []string {
	if s.Items == nil || s.Items.Schema == nil {
		return nil
	}
	return rules(*s.Items.Schema, "")
}

// What a managed resource refuses about the lists a composite copies into
// it, the composite's XRD refuses first, in the composite's words: a team
// sees the refusal when it writes the request, instead of a Warning in the
// managed resource's field names and a proxy that keeps its old settings.
// The rules over whole lists are affordable only with the lists bounded, so
// the XRD's bounds are the managed resource's or tighter.
func TestXRDsCarryTheManagedResourceRules(t *testing.T) {
	mrs, err := filepath.Glob(filepath.Join("..", "package", "crds", "proxy.*.yaml"))
	if err != nil || len(mrs) == 0 {
		t.Fatalf("no managed resource CRDs (%v)", err)
	}
	// The request's auth is a boolean where the managed resource's is
	// auth.enabled; nothing else differs.
	composite := func(rule string) string {
		return strings.ReplaceAll(rule, "self.auth.enabled", "self.auth")
	}
	// What the managed resources (every kind, both scopes) say, once.
	type list struct {
		items             []string
		maxItems, itemLen *int64
	}
	var cidrRules []string
	lists := map[string]*list{"allowedClientCIDRs": {}, "allowedDestinations": {}, "allowedPorts": {}}
	for _, file := range mrs {
		mr := load(t, file)
		proxy := mr.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["forProvider"].Properties["proxy"]
		for _, r := range rules(proxy, ".allowedClientCIDRs") {
			if !slices.Contains(cidrRules, composite(r)) {
				cidrRules = append(cidrRules, composite(r))
			}
		}
		for name, l := range lists {
			m := proxy.Properties[name]
			for _, r := range itemRules(m) {
				if !slices.Contains(l.items, r) {
					l.items = append(l.items, r)
				}
			}
			if m.MaxItems != nil && (l.maxItems == nil || *m.MaxItems < *l.maxItems) {
				l.maxItems = m.MaxItems
			}
			if m.Items.Schema.MaxLength != nil && (l.itemLen == nil || *m.Items.Schema.MaxLength < *l.itemLen) {
				l.itemLen = m.Items.Schema.MaxLength
			}
		}
	}
	if len(cidrRules) < 3 || len(lists["allowedDestinations"].items) < 2 {
		t.Fatalf("read %d rules on allowedClientCIDRs and %d on allowedDestinations' items from the managed resource CRDs; the test reads them wrong", len(cidrRules), len(lists["allowedDestinations"].items))
	}
	for _, file := range []string{"xrd-namespaced.yaml", "xrd-legacy.yaml"} {
		t.Run(file, func(t *testing.T) {
			xrd := load(t, filepath.Join("..", "package", "configuration", file))
			spec := xrd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
			for _, r := range spec.XValidations {
				if strings.Contains(r.Message, "auth.enabled") {
					t.Errorf("rule on %s speaks of auth.enabled, the managed resource's field; the composite's is auth: %s", r.FieldPath, r.Message)
				}
			}
			for _, r := range cidrRules {
				if !slices.Contains(rules(spec, ".allowedClientCIDRs"), r) {
					t.Errorf("spec has no rule on allowedClientCIDRs equivalent to the managed resources':\n%s", r)
				}
			}
			for name, l := range lists {
				x := spec.Properties[name]
				for _, r := range l.items {
					if !slices.Contains(itemRules(x), r) {
						t.Errorf("spec.%s items lack the managed resources' rule %s", name, r)
					}
				}
				if x.MaxItems == nil || l.maxItems != nil && *x.MaxItems > *l.maxItems {
					t.Errorf("spec.%s maxItems %v; want at most the managed resources' %v", name, x.MaxItems, l.maxItems)
				}
				if l.itemLen != nil && (x.Items.Schema.MaxLength == nil || *x.Items.Schema.MaxLength > *l.itemLen) {
					t.Errorf("spec.%s items maxLength %v; want at most the managed resources' %d", name, x.Items.Schema.MaxLength, *l.itemLen)
				}
			}
		})
	}
}

// A tenant cannot choose another Composition for the type (one composing
// anything the platform offers for some other purpose).
func TestXRDsEnforceTheirComposition(t *testing.T) {
	for xrdFile, compFile := range map[string]string{"xrd-namespaced.yaml": "composition-namespaced.yaml", "xrd-legacy.yaml": "composition-legacy.yaml"} {
		xrd := load(t, filepath.Join("..", "package", "configuration", xrdFile))
		b, err := os.ReadFile(filepath.Join("..", "package", "configuration", compFile))
		if err != nil {
			t.Fatal(err)
		}
		var comp crdLike
		if err := yaml.Unmarshal(b, &comp); err != nil {
			t.Fatal(err)
		}
		if ref := xrd.Spec.EnforcedCompositionRef; ref == nil || ref.Name != comp.Metadata.Name {
			t.Errorf("%s enforcedCompositionRef %v; want %s, the Composition of %s", xrdFile, ref, comp.Metadata.Name, compFile)
		}
		if xrd.Spec.DefaultCompositionRef != nil {
			t.Errorf("%s sets defaultCompositionRef too; the enforced Composition is the only one", xrdFile)
		}
	}
}

// Crossplane goes on writing the connection Secret it made first, so the
// name cannot change, appear or disappear once a composite exists.
func TestConnectionSecretNameIsFixed(t *testing.T) {
	xrd := load(t, filepath.Join("..", "package", "configuration", "xrd-namespaced.yaml"))
	spec := xrd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	if !slices.Contains(rules(spec.Properties["connectionSecretName"], ""), "self == oldSelf") {
		t.Error("spec.connectionSecretName has no rule self == oldSelf")
	}
	if !slices.Contains(rules(spec, ".connectionSecretName"), "has(self.connectionSecretName) == has(oldSelf.connectionSecretName)") {
		t.Error("spec has no rule that connectionSecretName cannot be added or removed")
	}
}
