package external

import (
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Pick resolves a catalogue key of the parameters: the given key when the
// config has it, the only key when the parameter is empty and the config
// has exactly one, and otherwise an error naming the field and the
// accepted values.
func Pick(field, key string, keys []string, cfg *Config) (string, error) {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	if key == "" {
		switch len(sorted) {
		case 1:
			return sorted[0], nil
		case 0:
			return "", errors.Errorf("%s: %s has none to choose from", field, cfg.Name)
		default:
			return "", errors.Errorf("%s is required: %s has several (%s)", field, cfg.Name, strings.Join(sorted, ", "))
		}
	}
	if !slices.Contains(sorted, key) {
		return "", errors.Errorf("%s: %q is not in %s: want one of %s", field, key, cfg.Name, strings.Join(sorted, ", "))
	}
	return key, nil
}

// Keys returns the keys of a catalogue.
func Keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
