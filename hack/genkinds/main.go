// Command genkinds writes the API kinds of both scopes, from the table in
// kinds.go and the one template kinds.go.tmpl, into zz_generated.kinds.go in
// each API package: the types (whose markers controller-gen turns into the
// CRDs), their accessors, the group's scheme and each kind's type metadata.
// What a package's kinds share is the template; what differs is a row of
// the table or the kind's scope. Run from apis/ by `make generate`, before
// controller-gen and angryjet, which read what it writes:
//
//	genkinds HEADER-FILE
package main

import (
	"bytes"
	_ "embed"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"strings"
	"text/template"
)

// scope is a kind's CRD scope, as +kubebuilder:resource:scope spells it.
type scope string

const (
	namespaced scope = "Namespaced"
	cluster    scope = "Cluster"
)

// role is what a kind is to crossplane-runtime.
type role int

const (
	proxy  role = iota // a managed resource: a proxy
	config             // a ProviderConfig
	usage              // a ProviderConfigUsage
)

// A kind is one generated API type.
type kind struct {
	// Name is the Go type's name and the CRD's kind.
	Name  string
	Role  role
	Scope scope
	// Doc is the type's doc comment, the CRD's description; lines are
	// kept as written.
	Doc string
	// Columns are a proxy's own printer columns, shown after the ones
	// every proxy has.
	Columns []column
	// Spec and SpecDoc are a config's spec type and its doc comment.
	Spec, SpecDoc string
	// Rules are a config's own validation rules, checked before the
	// Secret-ref rules of its scope.
	Rules []rule
}

// An apiPackage is one generated package.
type apiPackage struct {
	// Dir is the package's directory below apis/.
	Dir   string
	Kinds []kind
}

// A column is a kubectl printer column.
type column struct {
	Name, Type, JSONPath string
	Priority             int
}

// A rule is a CEL validation rule on a spec.
type rule struct {
	Rule, Message, FieldPath string
}

// A secretRef is a Secret reference of a ProviderConfigSpec.
type secretRef struct {
	// Block is the backend block, Ref the reference's field under its
	// credentials.
	Block, Ref string
	// Optional refs may be left out of a block that is set.
	Optional bool
}

//go:embed kinds.go.tmpl
var source string

var tmpl = template.Must(template.New("kinds").Funcs(template.FuncMap{
	"comment": func(s string) string { return "// " + strings.ReplaceAll(s, "\n", "\n// ") },
	"columns": func(k kind) []column {
		switch k.Role {
		case proxy:
			return append(append(append([]column{}, proxyColumns...), k.Columns...), proxyWideColumns...)
		case config:
			return configColumns
		}
		return usageColumns
	},
}).Parse(source))

func main() {
	if len(os.Args) != 2 {
		fail(fmt.Errorf("usage: genkinds HEADER-FILE (run in apis/)"))
	}
	header, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	for _, p := range packages {
		if err := generate(p, string(header)); err != nil {
			fail(fmt.Errorf("%s: %w", p.Dir, err))
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "genkinds:", err)
	os.Exit(1)
}

func generate(p apiPackage, header string) error {
	doc, err := os.ReadFile(filepath.Join(p.Dir, "doc.go"))
	if err != nil {
		return err
	}
	group, version := marker(string(doc), "+groupName="), marker(string(doc), "+versionName=")
	if group == "" || version == "" {
		return fmt.Errorf("doc.go names no +groupName and +versionName")
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, map[string]any{
		"Header":  header,
		"Package": filepath.Base(p.Dir),
		"Group":   group,
		"Version": version,
		"Kinds":   p.Kinds,
	}); err != nil {
		return err
	}
	src, err := format.Source(buf.Bytes())
	if err != nil {
		return fmt.Errorf("formatting generated code: %w\n%s", err, buf.String())
	}
	return os.WriteFile(filepath.Join(p.Dir, "zz_generated.kinds.go"), src, 0o644)
}

// marker returns the value of the comment marker named prefix in src.
func marker(src, prefix string) string {
	for _, line := range strings.Split(src, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(strings.TrimPrefix(line, "//")), prefix); ok {
			return v
		}
	}
	return ""
}

// inScope returns the kinds as proxies of scope s.
func inScope(kinds []kind, s scope) []kind {
	out := make([]kind, len(kinds))
	for i, k := range kinds {
		k.Role, k.Scope = proxy, s
		out[i] = k
	}
	return out
}

// Cluster tells whether the kind is cluster-scoped.
func (k kind) Cluster() bool { return k.Scope == cluster }

// IsProxy, IsConfig and IsUsage tell the kind's role.
func (k kind) IsProxy() bool  { return k.Role == proxy }
func (k kind) IsConfig() bool { return k.Role == config }
func (k kind) IsUsage() bool  { return k.Role == usage }

// managementPoliciesRule admits only the management policy sets
// crossplane-runtime v2 supports (its defaultSupportedManagementPolicies,
// compared as sets): it refuses any other before the reconciler, and with
// it the resource's deletion, stops on it for good. Without Create, Delete
// goes only alone with Observe.
var managementPoliciesRule = rule{
	// Ternaries rather than one disjunction: the estimated cost of a rule
	// counts one branch of each, and the list has no maxItems.
	Rule: "!has(self.managementPolicies) || ('*' in self.managementPolicies ? self.managementPolicies.all(p, p == '*') : " +
		"'Observe' in self.managementPolicies ? 'Create' in self.managementPolicies || " +
		"!('Delete' in self.managementPolicies && ('Update' in self.managementPolicies || 'LateInitialize' in self.managementPolicies)) : " +
		"size(self.managementPolicies) == 0)",
	Message: "managementPolicies must be a set crossplane-runtime supports, or the resource is neither reconciled nor deleted: " +
		"[*]; [] (paused); Observe with Create and any of Update, Delete, LateInitialize; " +
		"or Observe alone, with Delete, with Update, with LateInitialize, or with Update and LateInitialize",
	FieldPath: ".managementPolicies",
}

// SpecRules are the validation rules on the kind's spec: a cluster-scoped
// kind's Secret refs name their namespace, a namespaced kind's do not (its
// Secrets are read from its own namespace).
func (k kind) SpecRules() []rule {
	namespace := "has("
	if !k.Cluster() {
		namespace = "!has("
	}
	if k.Role == proxy {
		var rules []rule
		for _, ref := range []struct{ block, ref string }{
			{"forProvider.proxy.auth", "forProvider.proxy.auth.passwordSecretRef"},
			{"forProvider.proxy.tls", "forProvider.proxy.tls.secretRef"},
		} {
			r := rule{
				Rule:      "!has(self." + ref.block + ") || !has(self." + ref.ref + ") || " + namespace + "self." + ref.ref + ".namespace)",
				Message:   ref.ref + ".namespace is required on a cluster-scoped resource",
				FieldPath: "." + ref.ref,
			}
			if !k.Cluster() {
				r.Message = ref.ref + ".namespace is not allowed on a namespaced resource: the Secret is read from the resource's own namespace"
			}
			rules = append(rules, r)
		}
		return append(rules, managementPoliciesRule)
	}
	rules := append([]rule{}, k.Rules...)
	for _, s := range secretRefs {
		ref := s.Block + ".credentials." + s.Ref
		guard := "!has(self." + s.Block + ") || "
		if s.Optional {
			guard += "!has(self." + ref + ") || "
		}
		r := rule{
			Rule:      guard + namespace + "self." + ref + ".namespace)",
			Message:   ref + ".namespace is required on a cluster-scoped config",
			FieldPath: "." + ref + ".namespace",
		}
		if !k.Cluster() {
			r.Message = ref + ".namespace is not allowed on a namespaced ProviderConfig: Secrets are read from the config's own namespace"
		}
		rules = append(rules, r)
	}
	return rules
}
