// Package docs checks the mechanical part of the documentation against
// the code: every flag, environment variable, metric, condition reason
// and make target that README.md and docs/*.md name in code (inline code
// or a fenced block, where a reader copies from) exists in the code or
// the Makefile. What a page says about them is for a reader to check;
// that a name is real is not.
package docs

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/egressproxy/provider-egressproxy/internal/envflag"
)

// Kinds of names a page can give.
const (
	Flag     = "flag"
	Env      = "environment variable"
	Metric   = "metric"
	Reason   = "condition reason"
	Target   = "make target"
	FlagEnv  = "flag's environment variable"
	Provider = "provider flag"
)

// Ref is one name a page gives, where it gives it.
type Ref struct {
	Kind, Name string
	File       string
	Line       int
	// Env is the variable a flags table pairs with the flag (FlagEnv).
	Env string
}

func (r Ref) String() string {
	return fmt.Sprintf("%s:%d: %s %q", r.File, r.Line, r.Kind, r.Name)
}

var (
	fenceRe  = regexp.MustCompile("(?m)^```")
	spanRe   = regexp.MustCompile("`([^`\n]+)`")
	flagRe   = regexp.MustCompile(`(?:^|[\s(=\[,'"])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)`)
	envRe    = regexp.MustCompile(`(?:^|[^\w$.{-])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b`)
	metricRe = regexp.MustCompile(`\b((?:egressproxy|crossplane_managed_resource)_[a-z0-9_]*[a-z0-9])\b`)
	makeRe   = regexp.MustCompile(`(?:^|&&\s*|;\s*|\$\s+|sudo\s+(?:-E\s+)?)make\s+([a-z][a-z0-9-]*)`)
	// A row of a flags table: | `--flag` | `VARIABLE` | ...
	flagRowRe = regexp.MustCompile("^\\|\\s*`--([a-z][a-z0-9-]*)`\\s*\\|\\s*`([A-Z][A-Z0-9_]*)`\\s*\\|")
	// A reason is CamelCase: at least one lower-case letter (APIError
	// is one, QUOTA_EXCEEDED is not).
	reasonRe = regexp.MustCompile("`([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)`")
	// Prose that introduces reasons: "Reasons: `A`, `B`", "reason `C`".
	reasonWordRe = regexp.MustCompile(`(?i)\breasons?\b`)
)

// Extract is every name the Markdown text of file gives, by kind.
func Extract(file, text string) []Ref {
	var refs []Ref
	add := func(kind, name string, line int) {
		refs = append(refs, Ref{Kind: kind, Name: name, File: file, Line: line})
	}
	lines := strings.Split(text, "\n")
	inFence := false
	var reasonCol = -1 // the reason column of the table being read
	for i, l := range lines {
		n := i + 1
		if fenceRe.MatchString(l) {
			inFence = !inFence
			continue
		}
		var code []string
		if inFence {
			code = []string{l}
		} else {
			for _, m := range spanRe.FindAllStringSubmatch(l, -1) {
				code = append(code, m[1])
			}
		}
		for _, c := range code {
			for _, m := range flagRe.FindAllStringSubmatch(c, -1) {
				add(Flag, m[1], n)
			}
			for _, m := range envRe.FindAllStringSubmatch(c, -1) {
				add(Env, m[1], n)
			}
			for _, m := range metricRe.FindAllStringSubmatch(c, -1) {
				add(Metric, m[1], n)
			}
			for _, m := range makeRe.FindAllStringSubmatch(strings.TrimSpace(c), -1) {
				add(Target, m[1], n)
			}
		}
		if inFence {
			continue
		}
		if m := flagRowRe.FindStringSubmatch(l); m != nil {
			refs = append(refs, Ref{Kind: FlagEnv, Name: m[1], Env: m[2], File: file, Line: n})
		}
		// Tables with a reason column: the reason is the cell's first
		// names, before a colon introduces its message.
		if strings.HasPrefix(strings.TrimSpace(l), "|") {
			cells := tableCells(l)
			if reasonCol < 0 || isSeparator(l) {
				for j, c := range cells {
					if strings.EqualFold(strings.TrimSpace(c), "reason") {
						reasonCol = j
					}
				}
				continue
			}
			if reasonCol < len(cells) {
				cell := cells[reasonCol]
				if k := strings.Index(cell, "`:"); k >= 0 {
					cell = cell[:k+1]
				}
				for _, m := range reasonRe.FindAllStringSubmatch(cell, -1) {
					add(Reason, m[1], n)
				}
			}
			continue
		}
		reasonCol = -1
	}
	// Prose: the sentence after the word reason (or reasons) names them.
	for i, l := range lines {
		for _, loc := range reasonWordRe.FindAllStringIndex(l, -1) {
			rest := l[loc[1]:]
			// The sentence may run on to the following lines of its paragraph.
			for j := i + 1; j < len(lines) && strings.TrimSpace(lines[j]) != "" && !strings.HasPrefix(strings.TrimSpace(lines[j]), "|"); j++ {
				rest += " " + lines[j]
			}
			if strings.HasPrefix(strings.TrimSpace(l), "|") {
				continue
			}
			if end := sentenceEnd(rest); end >= 0 {
				rest = rest[:end]
			}
			for _, m := range reasonRe.FindAllStringSubmatch(rest, -1) {
				add(Reason, m[1], i+1)
			}
		}
	}
	return refs
}

// sentenceEnd is where the sentence starting text ends: a full stop
// before a space or the end (a dot inside a path or a name does not end
// it), or the parenthesis closing one the sentence is in.
func sentenceEnd(text string) int {
	inCode := false
	for i, r := range text {
		switch {
		case r == '`':
			inCode = !inCode
		case inCode:
		case r == ')' && !strings.Contains(text[:i], "("):
			return i
		case r == '.' && (i+1 == len(text) || text[i+1] == ' '):
			return i
		}
	}
	return -1
}

func tableCells(l string) []string {
	l = strings.TrimSpace(l)
	l = strings.TrimPrefix(l, "|")
	l = strings.TrimSuffix(l, "|")
	return strings.Split(l, "|")
}

func isSeparator(l string) bool {
	return strings.Trim(strings.TrimSpace(l), "|-: ") == ""
}

// Known is what exists, by kind.
type Known struct {
	Flags, ProviderFlags, Env, Metrics, Reasons, Targets map[string]bool
}

// Foreign are names the pages give that belong to other programs the
// reader runs (kubectl, Crossplane core, the OpenTelemetry SDK), which
// no file of this repository spells: each says whose it is.
var Foreign = map[string]string{
	Flag + " from-file":                           "kubectl create secret/configmap",
	Flag + " type":                                "kubectl patch",
	Flag + " from-literal":                        "kubectl create secret/configmap",
	Flag + " allocate-node-cidrs":                 "kube-controller-manager",
	Flag + " zone":                                "gcloud",
	Flag + " enable-usages":                       "Crossplane core",
	Flag + " enable-provider-deletion-protection": "Crossplane core",
	Env + " OTEL_EXPORTER_OTLP_HEADERS":           "the OpenTelemetry SDK's exporter reads it",
}

// Check is every ref that names what does not exist, as one line each.
func Check(refs []Ref, k Known) []string {
	var bad []string
	for _, r := range refs {
		if _, ok := Foreign[r.Kind+" "+r.Name]; ok {
			continue
		}
		var why string
		switch r.Kind {
		case Flag:
			if !k.Flags[r.Name] {
				why = "no program of this repository defines it, and no script passes it"
			}
		case Env:
			if !k.Env[r.Name] {
				why = "no code, script or Makefile reads or sets it"
			}
		case Metric:
			if !metricKnown(k.Metrics, r.Name) {
				why = "no such metric is registered"
			}
		case Reason:
			if !k.Reasons[r.Name] {
				why = "no code writes such a reason"
			}
		case Target:
			if !k.Targets[r.Name] {
				why = "the Makefile has no such target"
			}
		case FlagEnv:
			switch {
			case !k.ProviderFlags[r.Name]:
				why = "the provider has no such flag"
			case envflag.Name(r.Name) != r.Env:
				why = fmt.Sprintf("its environment variable is %s, not %s", envflag.Name(r.Name), r.Env)
			}
		}
		if why != "" {
			bad = append(bad, r.String()+": "+why)
		}
	}
	return bad
}

func metricKnown(m map[string]bool, name string) bool {
	if m[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && m[base] {
			return true
		}
	}
	return false
}

var (
	goFlagRe    = regexp.MustCompile(`\.(?:(?:Bool|String|Int|Int64|Uint|Uint64|Float64|Duration)(?:Var)?|Var|TextVar|Func|BoolFunc)\(\s*(?:&?[\w.\[\]()]+,\s*)?"([a-z][a-z0-9-]*)"`)
	literalFlag = regexp.MustCompile(`--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)`)
	// The local control plane passes kube-apiserver's flags as
	// args.Set("name", values...).
	argSetRe     = regexp.MustCompile(`\bargs\.(?:Set|Append|Add)\(\s*"([a-z][a-z0-9-]*)"`)
	upperRe      = regexp.MustCompile(`\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b`)
	optsRe       = regexp.MustCompile(`(?s)Opts\{(.*?)\n\s*\}`)
	optFieldRe   = regexp.MustCompile(`(Namespace|Subsystem|Name):\s*"([a-z0-9_]+)"`)
	stringLitRe  = regexp.MustCompile(`"([A-Z][A-Za-z0-9]+)"`)
	targetRe     = regexp.MustCompile(`^([A-Za-z0-9_.$()-][A-Za-z0-9_.$() -]*?)\s*:([^=]|$)`)
	makeVarRe    = regexp.MustCompile(`^([A-Z_]+)\s*:?=\s*(.*)$`)
	makeVarUseRe = regexp.MustCompile(`^\$\(([A-Z_]+)\)$`)
)

// Scan reads what exists from the repository at root: the flags every Go
// program defines (and those internal/provider defines, the provider's),
// every --flag and UPPER_CASE name the code, scripts and Makefile spell,
// the metrics Go code declares (prometheus Opts literals), the reasons
// non-test Go code spells as string literals, and the Makefile's
// targets. extraMetrics and extraReasons are what the provider's
// dependencies define (crossplane-runtime's).
func Scan(root string, extraMetrics, extraReasons []string) (Known, error) {
	k := Known{Flags: map[string]bool{}, ProviderFlags: map[string]bool{}, Env: map[string]bool{}, Metrics: map[string]bool{}, Reasons: map[string]bool{}, Targets: map[string]bool{}}
	for _, m := range extraMetrics {
		k.Metrics[m] = true
	}
	for _, r := range extraReasons {
		k.Reasons[r] = true
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".cache", "bin", "node_modules":
				return filepath.SkipDir
			}
			// This check's own fixtures plant wrong names.
			if filepath.ToSlash(rel) == "test/docs/testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if strings.HasSuffix(name, ".md") || strings.HasSuffix(name, ".gz") || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path) //nolint:gosec // files of the repository being checked.
		if err != nil {
			return err
		}
		text := string(b)
		for _, m := range literalFlag.FindAllStringSubmatch(text, -1) {
			k.Flags[m[1]] = true
		}
		for _, m := range upperRe.FindAllStringSubmatch(text, -1) {
			k.Env[m[1]] = true
		}
		if name == "Makefile" {
			for t := range makeTargets(text) {
				k.Targets[t] = true
			}
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		for _, m := range argSetRe.FindAllStringSubmatch(text, -1) {
			k.Flags[m[1]] = true
		}
		for _, m := range goFlagRe.FindAllStringSubmatch(text, -1) {
			k.Flags[m[1]] = true
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			// Only the provider's and the function's flags have
			// variables (envflag).
			switch filepath.ToSlash(filepath.Dir(rel)) {
			case "internal/provider":
				k.ProviderFlags[m[1]] = true
				k.Env[envflag.Name(m[1])] = true
			case "function/cmd/function-egressproxy":
				k.Env[envflag.Name(m[1])] = true
			}
		}
		for _, m := range optsRe.FindAllStringSubmatch(text, -1) {
			var parts []string
			for _, f := range optFieldRe.FindAllStringSubmatch(m[1], -1) {
				parts = append(parts, f[2])
			}
			if len(parts) > 0 {
				k.Metrics[strings.Join(parts, "_")] = true
			}
		}
		if !strings.HasSuffix(name, "_test.go") {
			for _, m := range stringLitRe.FindAllStringSubmatch(text, -1) {
				k.Reasons[m[1]] = true
			}
		}
		return nil
	})
	return k, err
}

// makeTargets are the rules' targets of a Makefile, with $(VAR) lists
// expanded.
func makeTargets(text string) map[string]bool {
	vars := map[string][]string{}
	out := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(text))
	var rules []string
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "#") {
			continue
		}
		if m := makeVarRe.FindStringSubmatch(l); m != nil {
			vars[m[1]] = strings.Fields(m[2])
			continue
		}
		if m := targetRe.FindStringSubmatch(l); m != nil {
			rules = append(rules, strings.Fields(m[1])...)
		}
	}
	for _, t := range rules {
		if m := makeVarUseRe.FindStringSubmatch(t); m != nil {
			for _, v := range vars[m[1]] {
				out[v] = true
			}
			continue
		}
		if !strings.HasPrefix(t, ".") && !strings.Contains(t, "$") {
			out[t] = true
		}
	}
	return out
}

// Pages are README.md and docs/*.md under root.
func Pages(root string) ([]string, error) {
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	sort.Strings(pages)
	return slices.Insert(pages, 0, filepath.Join(root, "README.md")), nil
}
