package pvetest

import (
	"bytes"
	"compress/gzip"
	_ "embed" // the published API schema
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// apidoc is the Proxmox VE API schema as the API viewer publishes it
// (apidoc.js's apiSchema), gzipped: see README.md for its provenance.
//
//go:embed pve-apidoc.json.gz
var apidoc []byte

// APIDocSHA256 is the SHA-256 of the uncompressed schema, so a test can
// prove the embedded copy is the published one.
const APIDocSHA256 = "280b265cb901b2bbb5640f8d5493dd414693f97922ab1a9afaabe8d63591a534"

// Schema is the parsed API schema: a tree of paths, each with the methods
// it accepts, their parameters and the shape of their answers.
type Schema struct {
	roots []*schemaNode
}

type schemaNode struct {
	Path     string                 `json:"path"`
	Text     string                 `json:"text"`
	Info     map[string]*MethodInfo `json:"info"`
	Children []*schemaNode          `json:"children"`
	segments []string               // Path split on "/", without the empty first one
	kids     map[string]*schemaNode // fixed children by segment
	param    *schemaNode            // the child whose segment is {something}
}

// MethodInfo is one method of one path.
type MethodInfo struct {
	Method     string `json:"method"`
	Name       string `json:"name"`
	Parameters *Type  `json:"parameters"`
	Returns    *Type  `json:"returns"`
	// Path is the schema path the method belongs to, with its {placeholders}.
	Path string `json:"-"`
}

// Type is a JSON-schema-like type of the Proxmox VE schema. Numbers and
// booleans appear in the published document as numbers or strings, hence
// the raw fields.
type Type struct {
	Type                 string           `json:"type"`
	Optional             json.RawMessage  `json:"optional"`
	Enum                 []string         `json:"enum"`
	Pattern              string           `json:"pattern"`
	Minimum              json.RawMessage  `json:"minimum"`
	Maximum              json.RawMessage  `json:"maximum"`
	MaxLength            json.RawMessage  `json:"maxLength"`
	Format               json.RawMessage  `json:"format"`
	Properties           map[string]*Type `json:"properties"`
	AdditionalProperties json.RawMessage  `json:"additionalProperties"`
	Items                *Type            `json:"items"`
	Alias                string           `json:"alias"`
	DefaultKey           json.RawMessage  `json:"default_key"`
}

// LoadSchema parses the embedded schema once per process.
var LoadSchema = sync.OnceValues(loadSchema)

func loadSchema() (*Schema, error) {
	b, err := APIDoc()
	if err != nil {
		return nil, err
	}
	var roots []*schemaNode
	if err := json.Unmarshal(b, &roots); err != nil {
		return nil, fmt.Errorf("pvetest: parsing the API schema: %w", err)
	}
	for _, r := range roots {
		index(r)
	}
	return &Schema{roots: roots}, nil
}

// APIDoc returns the uncompressed published schema.
func APIDoc() ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(apidoc))
	if err != nil {
		return nil, fmt.Errorf("pvetest: the embedded API schema: %w", err)
	}
	return io.ReadAll(zr)
}

func index(n *schemaNode) {
	n.segments = strings.Split(strings.TrimPrefix(n.Path, "/"), "/")
	n.kids = map[string]*schemaNode{}
	for m, i := range n.Info {
		i.Path = n.Path
		if i.Method == "" {
			i.Method = m
		}
	}
	for _, c := range n.Children {
		index(c)
		last := c.segments[len(c.segments)-1]
		if strings.HasPrefix(last, "{") {
			n.param = c
		} else {
			n.kids[last] = c
		}
	}
}

// Lookup finds the method for an HTTP method and a request path below
// /api2/json (segments still escaped). It returns the method and the
// values of the path's placeholders, or an error saying what the schema
// lacks.
func (s *Schema) Lookup(method, escapedPath string) (*MethodInfo, map[string]string, error) {
	segs := strings.Split(strings.Trim(escapedPath, "/"), "/")
	params := map[string]string{}
	var cur *schemaNode
	for i, raw := range segs {
		seg, err := url.PathUnescape(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("path segment %q is not escaped properly", raw)
		}
		var next *schemaNode
		if i == 0 {
			for _, r := range s.roots {
				if r.segments[0] == seg {
					next = r
				}
			}
		} else if k, ok := cur.kids[seg]; ok {
			next = k
		} else if cur.param != nil {
			next = cur.param
		}
		if next == nil {
			return nil, nil, fmt.Errorf("no such path in the API schema: /%s", strings.Join(segs, "/"))
		}
		if last := next.segments[len(next.segments)-1]; strings.HasPrefix(last, "{") {
			params[strings.Trim(last, "{}")] = seg
		}
		cur = next
	}
	if cur == nil {
		return nil, nil, fmt.Errorf("empty path")
	}
	m, ok := cur.Info[method]
	if !ok {
		return nil, nil, fmt.Errorf("the API schema has no %s on %s", method, cur.Path)
	}
	return m, params, nil
}

// Methods returns every "METHOD /path" of the schema, sorted.
func (s *Schema) Methods() []string {
	var out []string
	var walk func(n *schemaNode)
	walk = func(n *schemaNode) {
		for m := range n.Info {
			out = append(out, m+" "+n.Path)
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	for _, r := range s.roots {
		walk(r)
	}
	sort.Strings(out)
	return out
}

// ValidateParams checks request parameters (path placeholders included)
// against the method's parameter schema, as the API server's parameter
// verification does: every name must be defined, every required one
// present, every value of its type, enum, pattern, range, length and
// format. It returns one message per problem, keyed by parameter name.
func (m *MethodInfo) ValidateParams(params map[string]string) map[string]string {
	errs := map[string]string{}
	var props map[string]*Type
	if m.Parameters != nil {
		props = m.Parameters.Properties
	}
	for name, v := range params {
		t := propertyFor(props, name)
		if t == nil {
			errs[name] = "property is not defined in schema and the schema does not allow additional properties"
			continue
		}
		if msg := t.checkString(v); msg != "" {
			errs[name] = msg
		}
	}
	for name, t := range props {
		if strings.Contains(name, "[n]") || t.optional() {
			continue
		}
		if _, ok := params[name]; !ok {
			errs[name] = "property is missing and it is not optional"
		}
	}
	return errs
}

// ValidateReturn checks the data of an answer (the "data" member of the
// JSON envelope, decoded into interface values) against the method's
// returns schema.
func (m *MethodInfo) ValidateReturn(data any) []string {
	if m.Returns == nil {
		return nil
	}
	var out []string
	m.Returns.checkValue("data", data, &out)
	return out
}

// propertyFor finds the property named name, including indexed ones such
// as net[n] for net0.
func propertyFor(props map[string]*Type, name string) *Type {
	if t, ok := props[name]; ok {
		return t
	}
	for k, t := range props {
		prefix, ok := strings.CutSuffix(k, "[n]")
		if !ok {
			continue
		}
		if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "" && isDigits(rest) {
			return t
		}
	}
	return nil
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

func (t *Type) optional() bool { return truthy(t.Optional) }

// truthy reads the schema's booleans: 1, "1", true.
func truthy(raw json.RawMessage) bool {
	s := strings.Trim(string(raw), `"`)
	return s == "1" || s == "true"
}

func rawNumber(raw json.RawMessage) (float64, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	f, err := strconv.ParseFloat(strings.Trim(string(raw), `"`), 64)
	return f, err == nil
}

// formatName returns the named format ("pve-vmid"), or "" when the format
// is absent or a property-string format.
func (t *Type) formatName() string {
	var s string
	if json.Unmarshal(t.Format, &s) == nil {
		return s
	}
	return ""
}

// formatProps returns the keys of a property-string format (net0's
// "virtio=...,bridge=vmbr0"), or nil.
func (t *Type) formatProps() map[string]*Type {
	if len(t.Format) == 0 || t.Format[0] != '{' {
		return nil
	}
	var m map[string]*Type
	if json.Unmarshal(t.Format, &m) != nil {
		return nil
	}
	return m
}

var boolText = map[string]bool{"0": true, "1": true, "true": true, "false": true, "yes": true, "no": true, "on": true, "off": true}

// checkString validates a parameter as sent on the wire (a string).
func (t *Type) checkString(v string) string {
	switch t.Type {
	case "boolean":
		if !boolText[strings.ToLower(v)] {
			return fmt.Sprintf("type check ('boolean') failed - got '%s'", v)
		}
		return ""
	case "integer":
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Sprintf("type check ('integer') failed - got '%s'", v)
		}
		return t.checkRange(float64(n))
	case "number":
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Sprintf("type check ('number') failed - got '%s'", v)
		}
		return t.checkRange(f)
	}
	return t.checkText(v)
}

func (t *Type) checkRange(f float64) string {
	if lo, ok := rawNumber(t.Minimum); ok && f < lo {
		return fmt.Sprintf("value must have a minimum value of %v", lo)
	}
	if hi, ok := rawNumber(t.Maximum); ok && f > hi {
		return fmt.Sprintf("value must have a maximum value of %v", hi)
	}
	return ""
}

// checkText validates a string value: enum, length, pattern, format.
func (t *Type) checkText(v string) string {
	if len(t.Enum) > 0 {
		found := false
		for _, e := range t.Enum {
			found = found || e == v
		}
		if !found {
			return fmt.Sprintf("value '%s' does not have a value in the enumeration '%s'", v, strings.Join(t.Enum, ", "))
		}
	}
	if n, ok := rawNumber(t.MaxLength); ok && float64(len(v)) > n {
		return fmt.Sprintf("value may only be %v characters long", n)
	}
	if t.Pattern != "" {
		if re := anchored(t.Pattern); re != nil && !re.MatchString(v) {
			return fmt.Sprintf("value does not match the regex pattern %s", t.Pattern)
		}
	}
	if f := t.formatName(); f != "" {
		if msg := checkNamedFormat(f, v); msg != "" {
			return msg
		}
	}
	if props := t.formatProps(); props != nil {
		return checkPropertyString(props, v)
	}
	return ""
}

var (
	patternMu    sync.Mutex
	patternCache = map[string]*regexp.Regexp{}
)

// anchored compiles a schema pattern the way the API server applies it
// (anchored at both ends). Perl syntax Go cannot compile is not checked.
func anchored(p string) *regexp.Regexp {
	patternMu.Lock()
	defer patternMu.Unlock()
	if re, ok := patternCache[p]; ok {
		return re
	}
	re, err := regexp.Compile(`^(?:` + p + `)$`)
	if err != nil {
		re = nil
	}
	patternCache[p] = re
	return re
}

// namedFormats are the named formats of the API server's JSONSchema.pm
// that the requests here use, as its verifiers accept them.
var namedFormats = map[string]*regexp.Regexp{
	"pve-node":                 regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?$`),
	"pve-storage-id":           regexp.MustCompile(`(?i)^[a-z][a-z0-9\-_.]*[a-z0-9]$`),
	"pve-configid":             regexp.MustCompile(`^[a-z][a-z0-9_\-]+$`),
	"pve-configid-list":        regexp.MustCompile(`^[a-z][a-z0-9_\-]+([,;\s]+[a-z][a-z0-9_\-]+)*$`),
	"pve-tag-list":             regexp.MustCompile(`(?i)^[a-z0-9_][a-z0-9_\-+.]*([;,\s]+[a-z0-9_][a-z0-9_\-+.]*)*$`),
	"dns-name":                 regexp.MustCompile(`^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?\.)*[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?$`),
	"pve-bridge-id":            regexp.MustCompile(`^[-_.\w\d]+$`),
	"mac-addr":                 regexp.MustCompile(`(?i)^[a-f0-9]{2}(:[a-f0-9]{2}){5}$`),
	"disk-size":                regexp.MustCompile(`^\d+(\.\d+)?[KMGT]?$`),
	"pve-volume-id-or-qm-path": regexp.MustCompile(`^(none|cdrom|/\S+|[a-z][a-z0-9\-_.]*[a-z0-9]:\S+)$`),
	"pve-storage-content":      regexp.MustCompile(`^(images|rootdir|vztmpl|iso|backup|snippets|import)$`),
}

func checkNamedFormat(name, v string) string {
	re, ok := namedFormats[name]
	if !ok || re.MatchString(v) {
		return ""
	}
	return fmt.Sprintf("value does not match the format '%s': '%s'", name, v)
}

// checkPropertyString validates "key=value,key=value" against the keys of
// a property-string format (the first value may omit its default key).
func checkPropertyString(props map[string]*Type, v string) string {
	defaultKey := ""
	for k, t := range props {
		if truthy(t.DefaultKey) {
			defaultKey = k
		}
	}
	seen := map[string]bool{}
	for i, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(part, "=")
		if !ok {
			if i != 0 || defaultKey == "" {
				return fmt.Sprintf("format error: value without key, but schema does not define a default key: '%s'", part)
			}
			k, val = defaultKey, part
		}
		t, ok := props[k]
		if !ok {
			return fmt.Sprintf("format error: %s: property is not defined in schema and the schema does not allow additional properties", k)
		}
		if t.Alias != "" {
			// model-as-key forms such as virtio=MAC: the key is the model.
			k = t.Alias
			t = props[t.Alias]
			if t == nil {
				return fmt.Sprintf("format error: alias %s of %s is not defined", k, part)
			}
		}
		if seen[k] {
			return fmt.Sprintf("format error: duplicate key in comma-separated list property: %s", k)
		}
		seen[k] = true
		if msg := t.checkString(val); msg != "" {
			return fmt.Sprintf("format error: %s: %s", k, msg)
		}
	}
	for k, t := range props {
		if t.Alias == "" && !t.optional() && !seen[k] && !truthy(t.DefaultKey) {
			return fmt.Sprintf("format error: %s: property is missing and it is not optional", k)
		}
	}
	return ""
}

// checkValue validates a decoded JSON value against t, appending problems
// to out with where as their location.
func (t *Type) checkValue(where string, v any, out *[]string) {
	bad := func(format string, args ...any) {
		*out = append(*out, where+": "+fmt.Sprintf(format, args...))
	}
	if v == nil {
		if t.Type != "" && t.Type != "null" && !t.optional() {
			bad("null where the schema wants %s", t.Type)
		}
		return
	}
	switch t.Type {
	case "null":
		bad("%T where the schema wants null", v)
	case "string":
		s, ok := v.(string)
		if !ok {
			bad("%T where the schema wants a string", v)
			return
		}
		if msg := t.checkText(s); msg != "" {
			bad("%s", msg)
		}
	case "integer", "number":
		f, ok := v.(float64)
		switch {
		case t.Type == "integer" && (!ok || f != math.Trunc(f)):
			bad("%v (%T) where the schema wants an integer", v, v)
			return
		case !ok:
			bad("%T where the schema wants a number", v)
			return
		}
		if msg := t.checkRange(f); msg != "" {
			bad("%s", msg)
		}
	case "boolean":
		switch b := v.(type) {
		case bool:
		case float64:
			if b != 0 && b != 1 {
				bad("%v where the schema wants a boolean (0 or 1)", b)
			}
		default:
			bad("%T where the schema wants a boolean", v)
		}
	case "array":
		l, ok := v.([]any)
		if !ok {
			bad("%T where the schema wants an array", v)
			return
		}
		if t.Items != nil {
			for i, e := range l {
				t.Items.checkValue(fmt.Sprintf("%s[%d]", where, i), e, out)
			}
		}
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			bad("%T where the schema wants an object", v)
			return
		}
		if t.Properties == nil {
			return
		}
		additional := truthy(t.AdditionalProperties)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := propertyFor(t.Properties, k)
			if p == nil {
				if !additional {
					bad("property %q is not in the schema", k)
				}
				continue
			}
			p.checkValue(where+"."+k, m[k], out)
		}
		for k, p := range t.Properties {
			if strings.Contains(k, "[n]") || p.optional() {
				continue
			}
			if _, ok := m[k]; !ok {
				bad("required property %q is missing", k)
			}
		}
	}
}
