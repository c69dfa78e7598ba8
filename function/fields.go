package function

import (
	"maps"
	"reflect"
	"slices"
	"strings"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// parameters are the forProvider types of the kinds a class may name: a
// class's parameters are checked against them, so that a misspelt field
// is refused rather than dropped by the API server without a word.
var parameters = map[string]reflect.Type{
	"GCPProxy":     reflect.TypeFor[spec.GCPProxyParameters](),
	"KVMProxy":     reflect.TypeFor[spec.KVMProxyParameters](),
	"PodProxy":     reflect.TypeFor[spec.PodProxyParameters](),
	"ProxmoxProxy": reflect.TypeFor[spec.ProxmoxProxyParameters](),
}

// unknownFields are the paths in v (a class's or size's parameters) that
// are not fields of t, with the fields t has where one is unknown.
func unknownFields(v any, t reflect.Type, path string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return nil // a type mismatch is the API server's to name
		}
		fields := jsonFields(t)
		var out []string
		for _, k := range slices.Sorted(maps.Keys(m)) {
			ft, ok := fields[k]
			if !ok {
				out = append(out, path+k+" (the fields here: "+strings.Join(slices.Sorted(maps.Keys(fields)), ", ")+")")
				continue
			}
			out = append(out, unknownFields(m[k], ft, path+k+".")...)
		}
		return out
	case reflect.Slice:
		l, ok := v.([]any)
		if !ok {
			return nil
		}
		var out []string
		for _, e := range l {
			out = append(out, unknownFields(e, t.Elem(), strings.TrimSuffix(path, ".")+"[].")...)
		}
		return out
	default:
		return nil
	}
}

// jsonFields are t's fields by their JSON names, with embedded structs'
// fields inlined.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case f.Anonymous && name == "":
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			maps.Copy(out, jsonFields(ft))
		case name == "":
			out[f.Name] = f.Type
		default:
			out[name] = f.Type
		}
	}
	return out
}
