package gcptest

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// The fake checks every request the client sends it, and every answer it
// gives, against Compute Engine's published discovery document: the one
// google.golang.org/api ships for compute/v1 (compute-api.json, in the
// module cache beside the generated client). A method, path, query
// parameter or body field the real API does not have, a value of the
// wrong JSON type or outside an enum, and a required parameter missing
// are all violations; a test whose fake saw one fails.

// apiModule is the module that ships the discovery document.
const apiModule = "google.golang.org/api"

// Discovery is the parsed discovery document.
type Discovery struct {
	// Parameters are the parameters every method takes (alt, fields, ...).
	Parameters map[string]*Param `json:"parameters"`
	Resources  map[string]*dResource
	Schemas    map[string]*Property `json:"schemas"`

	methods []*Method
}

type dResource struct {
	Methods   map[string]*Method    `json:"methods"`
	Resources map[string]*dResource `json:"resources"`
}

// Method is one method of the API.
type Method struct {
	ID         string            `json:"id"`
	HTTPMethod string            `json:"httpMethod"`
	Path       string            `json:"path"`
	Parameters map[string]*Param `json:"parameters"`
	Request    *Property         `json:"request"`
	Response   *Property         `json:"response"`

	segments []string
}

// Param is a path or query parameter.
type Param struct {
	Type     string   `json:"type"`
	Location string   `json:"location"`
	Required bool     `json:"required"`
	Repeated bool     `json:"repeated"`
	Enum     []string `json:"enum"`
	Format   string   `json:"format"`
}

// Property is a schema or one of its properties.
type Property struct {
	Ref                  string               `json:"$ref"`
	Type                 string               `json:"type"`
	Format               string               `json:"format"`
	Enum                 []string             `json:"enum"`
	Properties           map[string]*Property `json:"properties"`
	Items                *Property            `json:"items"`
	AdditionalProperties *Property            `json:"additionalProperties"`
}

// LoadDiscovery parses compute/v1's discovery document from the module
// cache (once per process).
var LoadDiscovery = sync.OnceValues(loadDiscovery)

func loadDiscovery() (*Discovery, error) {
	path, err := discoveryPath()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path) //nolint:gosec // The module cache's copy.
	if err != nil {
		return nil, err
	}
	d := &Discovery{}
	if err := json.Unmarshal(b, d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var walk func(map[string]*dResource)
	walk = func(rs map[string]*dResource) {
		for _, r := range rs {
			for _, m := range r.Methods {
				m.segments = strings.Split(m.Path, "/")
				d.methods = append(d.methods, m)
			}
			walk(r.Resources)
		}
	}
	walk(d.Resources)
	sort.Slice(d.methods, func(i, j int) bool { return d.methods[i].ID < d.methods[j].ID })
	return d, nil
}

// discoveryPath finds compute-api.json of the google.golang.org/api
// version the module requires: through the module cache named by the
// binary's build information, else (test binaries carry none) by asking
// the go command from within the module.
func discoveryPath() (string, error) {
	dir := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path != apiModule {
				continue
			}
			v := m.Version
			if m.Replace != nil {
				v = m.Replace.Version
			}
			if out, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
				dir = filepath.Join(strings.TrimSpace(string(out)), apiModule+"@"+v)
			}
		}
	}
	if dir == "" {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", apiModule).Output()
		if err != nil {
			return "", fmt.Errorf("gcptest: cannot find %s, which ships Compute Engine's discovery document (go list -m %s): %w", apiModule, apiModule, err)
		}
		dir = strings.TrimSpace(string(out))
	}
	p := filepath.Join(dir, "compute", "v1", "compute-api.json")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("gcptest: Compute Engine's discovery document: %w (run go mod download %s)", err, apiModule)
	}
	return p, nil
}

// match finds the method for an HTTP method and a path relative to the
// service path (projects/p/zones/z/instances/i), with its path parameters.
func (d *Discovery) match(httpMethod, rel string) (*Method, map[string]string) {
	segs := strings.Split(rel, "/")
	for _, m := range d.methods {
		if m.HTTPMethod != httpMethod || len(m.segments) != len(segs) {
			continue
		}
		params := map[string]string{}
		ok := true
		for i, s := range m.segments {
			if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
				params[strings.Trim(s, "{}+")] = segs[i]
				continue
			}
			if s != segs[i] {
				ok = false
				break
			}
		}
		if ok {
			return m, params
		}
	}
	return nil, nil
}

// systemParameters are query parameters every Google API accepts that
// the discovery document does not list: the REST clients' $alt (JSON with
// enums as numbers).
var systemParameters = map[string]bool{"$alt": true}

// CheckRequest returns the ways a request differs from the API: rel is the
// path below compute/v1/, body the decoded JSON body (nil without one).
// It returns the method too, to check the answer against.
func (d *Discovery) CheckRequest(httpMethod, rel string, query url.Values, body map[string]any) (*Method, []string) {
	m, pathParams := d.match(httpMethod, rel)
	if m == nil {
		return nil, []string{fmt.Sprintf("%s %s: no such method in Compute Engine's API", httpMethod, rel)}
	}
	var v []string
	where := m.ID
	for name, p := range m.Parameters {
		switch p.Location {
		case "path":
			if val, ok := pathParams[name]; ok {
				v = append(v, checkParam(where+": path parameter "+name, p, val)...)
			}
		case "query":
			if p.Required && !query.Has(name) {
				v = append(v, fmt.Sprintf("%s: required query parameter %s is missing", where, name))
			}
		}
	}
	for name, vals := range query {
		p := m.Parameters[name]
		if p == nil {
			p = d.Parameters[name]
		}
		if p == nil {
			if !systemParameters[name] {
				v = append(v, fmt.Sprintf("%s: query parameter %s does not exist", where, name))
			}
			continue
		}
		if len(vals) > 1 && !p.Repeated {
			v = append(v, fmt.Sprintf("%s: query parameter %s given %d times", where, name, len(vals)))
		}
		for _, val := range vals {
			v = append(v, checkParam(where+": query parameter "+name, p, val)...)
		}
	}
	switch {
	case m.Request == nil && body != nil:
		v = append(v, fmt.Sprintf("%s: takes no body, got one", where))
	case m.Request != nil && body == nil:
		v = append(v, fmt.Sprintf("%s: needs a %s body, got none", where, m.Request.Ref))
	case m.Request != nil:
		v = append(v, d.checkValue(where+" request "+m.Request.Ref, m.Request, body)...)
	}
	return m, v
}

// CheckResponse returns the ways a successful answer to m differs from
// the method's response schema.
func (d *Discovery) CheckResponse(m *Method, body any) []string {
	if m == nil || m.Response == nil {
		return nil
	}
	return d.checkValue(m.ID+" response "+m.Response.Ref, m.Response, body)
}

// CheckSchema returns the ways val, a decoded JSON value, differs from
// the document's schema named schema (Instance, Operation, ...).
func (d *Discovery) CheckSchema(schema string, val any) []string {
	return d.checkValue(schema, &Property{Ref: schema}, val)
}

func checkParam(where string, p *Param, val string) []string {
	if len(p.Enum) > 0 && !slices.Contains(p.Enum, val) {
		return []string{fmt.Sprintf("%s: %q is not one of %v", where, val, p.Enum)}
	}
	switch p.Type {
	case "integer":
		if _, err := strconv.ParseInt(val, 10, 64); err != nil {
			return []string{fmt.Sprintf("%s: %q is not an integer", where, val)}
		}
	case "boolean":
		if val != "true" && val != "false" {
			return []string{fmt.Sprintf("%s: %q is not a boolean", where, val)}
		}
	}
	return nil
}

// checkValue checks a decoded JSON value against a schema property.
func (d *Discovery) checkValue(where string, p *Property, val any) []string {
	if p.Ref != "" {
		s := d.Schemas[p.Ref]
		if s == nil {
			return []string{fmt.Sprintf("%s: schema %s is not in the document", where, p.Ref)}
		}
		p = s
	}
	if val == nil {
		return nil
	}
	switch p.Type {
	case "object":
		obj, ok := val.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: want an object, got %T", where, val)}
		}
		var v []string
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			sub := p.Properties[k]
			if sub == nil {
				sub = p.AdditionalProperties
			}
			if sub == nil {
				v = append(v, fmt.Sprintf("%s: field %s does not exist", where, k))
				continue
			}
			v = append(v, d.checkValue(where+"."+k, sub, obj[k])...)
		}
		return v
	case "array":
		arr, ok := val.([]any)
		if !ok {
			return []string{fmt.Sprintf("%s: want an array, got %T", where, val)}
		}
		var v []string
		for i, e := range arr {
			v = append(v, d.checkValue(fmt.Sprintf("%s[%d]", where, i), p.Items, e)...)
		}
		return v
	case "string":
		s, ok := val.(string)
		if !ok {
			return []string{fmt.Sprintf("%s: want a string (format %q), got %T", where, p.Format, val)}
		}
		if len(p.Enum) > 0 && !slices.Contains(p.Enum, s) {
			return []string{fmt.Sprintf("%s: %q is not one of %v", where, s, p.Enum)}
		}
		if p.Format == "int64" || p.Format == "uint64" {
			if _, err := strconv.ParseInt(s, 10, 64); err != nil {
				if _, err := strconv.ParseUint(s, 10, 64); err != nil {
					return []string{fmt.Sprintf("%s: %q is not a %s", where, s, p.Format)}
				}
			}
		}
	case "integer", "number":
		if _, ok := val.(float64); !ok {
			return []string{fmt.Sprintf("%s: want a number, got %T", where, val)}
		}
	case "boolean":
		if _, ok := val.(bool); !ok {
			return []string{fmt.Sprintf("%s: want a boolean, got %T", where, val)}
		}
	}
	return nil
}
