// Command methodsets generates the Crossplane method sets (the getters and
// setters crossplane-runtime's interfaces need) for the API packages named
// on the command line (after the header file), into zz_generated.methodsets.go in each.
//
// It does what crossplane-tools' angryjet does. angryjet cannot be used with
// crossplane-runtime v2.4.0: it recognises types by the import path
// github.com/crossplane/crossplane-runtime/v2/apis/common/v1, which runtime
// v2.4.0 no longer has (the types moved to
// github.com/crossplane/crossplane/apis/v2/core/v2), so it generates nothing
// (v0.0.0-20250731192036-00d407d8b7ec and -20251017183449-dd4517244339
// both; docs/development.md).
package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"
)

// kind is what a root type is, as far as crossplane-runtime cares.
type kind int

const (
	none kind = iota
	modernManaged
	legacyManaged
	providerConfig
	typedUsage
	legacyUsage
)

type root struct {
	Name string
	Kind kind
	List string // the list type's name, when the package has one
	// ConfigRef and SecretRef are the xpv2 types of the provider config
	// and connection Secret references, Item the resource interface of
	// the list's items: what tells the scopes' method sets apart.
	ConfigRef, SecretRef, Item string
}

// scoped fills in what r's methods return in its scope.
func (r *root) scoped() {
	switch r.Kind {
	case modernManaged:
		r.ConfigRef, r.SecretRef, r.Item = "ProviderConfigReference", "LocalSecretReference", "Managed"
	case legacyManaged:
		r.ConfigRef, r.SecretRef, r.Item = "Reference", "SecretReference", "LegacyManaged"
	case typedUsage:
		r.ConfigRef, r.Item = "ProviderConfigReference", "ProviderConfigUsage"
	case legacyUsage:
		r.ConfigRef, r.Item = "Reference", "ProviderConfigUsage"
	}
}

func main() {
	if len(os.Args) < 3 {
		fail(fmt.Errorf("usage: methodsets HEADER-FILE PACKAGE-DIR"))
	}
	header, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	for _, dir := range os.Args[2:] {
		if err := generate(dir, string(header)); err != nil {
			fail(fmt.Errorf("%s: %w", dir, err))
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "methodsets:", err)
	os.Exit(1)
}

func generate(dir, header string) error {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { //nolint:staticcheck // API packages have no build tags; the files are filtered here.
		// The kinds are hack/genkinds' zz_generated.kinds.go; the other
		// generated files hold no types.
		return (!strings.HasPrefix(fi.Name(), "zz_") || fi.Name() == "zz_generated.kinds.go") && !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		return err
	}
	structs := map[string]*ast.StructType{}
	pkgName := ""
	for name, p := range pkgs {
		pkgName = name
		for _, f := range p.Files {
			ast.Inspect(f, func(n ast.Node) bool {
				if ts, ok := n.(*ast.TypeSpec); ok {
					if st, ok := ts.Type.(*ast.StructType); ok {
						structs[ts.Name.Name] = st
					}
				}
				return true
			})
		}
	}
	var roots []root
	for name, st := range structs {
		k := classify(st, structs)
		if k == none {
			continue
		}
		r := root{Name: name, Kind: k}
		if _, ok := structs[name+"List"]; ok {
			r.List = name + "List"
		}
		r.scoped()
		roots = append(roots, r)
	}
	out := filepath.Join(dir, "zz_generated.methodsets.go")
	if len(roots) == 0 {
		_ = os.Remove(out)
		return nil
	}
	sort.Slice(roots, func(i, j int) bool { return roots[i].Name < roots[j].Name })

	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, map[string]any{"Header": header, "Package": pkgName, "Roots": roots}); err != nil {
		return err
	}
	src, err := format.Source(buf.Bytes())
	if err != nil {
		return fmt.Errorf("formatting generated code: %w\n%s", err, buf.String())
	}
	return os.WriteFile(out, src, 0o644)
}

// classify tells a root type's kind from what its Spec embeds, its Status
// type, or (for usages) what it embeds itself.
func classify(st *ast.StructType, structs map[string]*ast.StructType) kind {
	for _, f := range st.Fields.List {
		if len(f.Names) == 0 {
			switch typeName(f.Type) {
			case "TypedProviderConfigUsage":
				return typedUsage
			case "ProviderConfigUsage":
				return legacyUsage
			}
			continue
		}
		switch f.Names[0].Name {
		case "Status":
			if typeName(f.Type) == "ProviderConfigStatus" {
				return providerConfig
			}
		case "Spec":
			spec := structs[typeName(f.Type)]
			if spec == nil {
				continue
			}
			for _, sf := range spec.Fields.List {
				if len(sf.Names) != 0 {
					continue
				}
				switch typeName(sf.Type) {
				case "ManagedResourceSpec":
					return modernManaged
				case "ClusterManagedResourceSpec":
					return legacyManaged
				}
			}
		}
	}
	return none
}

func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.SelectorExpr:
		return t.Sel.Name
	case *ast.StarExpr:
		return typeName(t.X)
	}
	return ""
}

var tmpl = template.Must(template.New("").Funcs(template.FuncMap{
	"is": func(r root, k string) bool {
		return map[string]kind{"modern": modernManaged, "legacy": legacyManaged, "pc": providerConfig, "typed": typedUsage, "legacyUsage": legacyUsage}[k] == r.Kind
	},
	"managed": func(r root) bool { return r.Kind == modernManaged || r.Kind == legacyManaged },
	"usage":   func(r root) bool { return r.Kind == typedUsage || r.Kind == legacyUsage },
}).Parse(`{{ .Header }}
// Code generated by hack/methodsets. DO NOT EDIT.

package {{ .Package }}

import (
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
)
{{ range .Roots }}
{{- if or (managed .) (is . "pc") }}
// GetCondition of this {{ .Name }}.
func (mg *{{ .Name }}) GetCondition(ct xpv2.ConditionType) xpv2.Condition {
	return mg.Status.GetCondition(ct)
}

// SetConditions of this {{ .Name }}.
func (mg *{{ .Name }}) SetConditions(c ...xpv2.Condition) {
	mg.Status.SetConditions(c...)
}
{{ end }}
{{- if managed . }}
// GetManagementPolicies of this {{ .Name }}.
func (mg *{{ .Name }}) GetManagementPolicies() xpv2.ManagementPolicies {
	return mg.Spec.ManagementPolicies
}

// SetManagementPolicies of this {{ .Name }}.
func (mg *{{ .Name }}) SetManagementPolicies(r xpv2.ManagementPolicies) {
	mg.Spec.ManagementPolicies = r
}
{{ end }}
{{- if managed . }}
// GetProviderConfigReference of this {{ .Name }}.
func (mg *{{ .Name }}) GetProviderConfigReference() *xpv2.{{ .ConfigRef }} {
	return mg.Spec.ProviderConfigReference
}

// SetProviderConfigReference of this {{ .Name }}.
func (mg *{{ .Name }}) SetProviderConfigReference(r *xpv2.{{ .ConfigRef }}) {
	mg.Spec.ProviderConfigReference = r
}

// GetWriteConnectionSecretToReference of this {{ .Name }}.
func (mg *{{ .Name }}) GetWriteConnectionSecretToReference() *xpv2.{{ .SecretRef }} {
	return mg.Spec.WriteConnectionSecretToReference
}

// SetWriteConnectionSecretToReference of this {{ .Name }}.
func (mg *{{ .Name }}) SetWriteConnectionSecretToReference(r *xpv2.{{ .SecretRef }}) {
	mg.Spec.WriteConnectionSecretToReference = r
}
{{ end }}
{{- if is . "legacy" }}
// GetDeletionPolicy of this {{ .Name }}.
func (mg *{{ .Name }}) GetDeletionPolicy() xpv2.DeletionPolicy {
	return mg.Spec.DeletionPolicy
}

// SetDeletionPolicy of this {{ .Name }}.
func (mg *{{ .Name }}) SetDeletionPolicy(r xpv2.DeletionPolicy) {
	mg.Spec.DeletionPolicy = r
}
{{ end }}
{{- if is . "pc" }}
// GetUsers of this {{ .Name }}.
func (p *{{ .Name }}) GetUsers() int64 {
	return p.Status.Users
}

// SetUsers of this {{ .Name }}.
func (p *{{ .Name }}) SetUsers(i int64) {
	p.Status.Users = i
}
{{ end }}
{{- if usage . }}
// GetResourceReference of this {{ .Name }}.
func (p *{{ .Name }}) GetResourceReference() xpv2.TypedReference {
	return p.ResourceReference
}

// SetResourceReference of this {{ .Name }}.
func (p *{{ .Name }}) SetResourceReference(r xpv2.TypedReference) {
	p.ResourceReference = r
}
{{ end }}
{{- if usage . }}
// GetProviderConfigReference of this {{ .Name }}.
func (p *{{ .Name }}) GetProviderConfigReference() xpv2.{{ .ConfigRef }} {
	return p.ProviderConfigReference
}

// SetProviderConfigReference of this {{ .Name }}.
func (p *{{ .Name }}) SetProviderConfigReference(r xpv2.{{ .ConfigRef }}) {
	p.ProviderConfigReference = r
}
{{ end }}
{{- if and .List .Item }}
// GetItems of this {{ .List }}.
func (l *{{ .List }}) GetItems() []resource.{{ .Item }} {
	items := make([]resource.{{ .Item }}, len(l.Items))
	for i := range l.Items {
		items[i] = &l.Items[i]
	}
	return items
}
{{ end }}
{{- end }}
`))
