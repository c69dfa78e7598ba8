package external

import (
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Pick resolves a catalogue key of the parameters: the given key when the
// config has it; when the parameter is empty, the key the instance was
// made with (recorded, from its status) while the config still has it,
// else the only key when the config has exactly one; and otherwise an
// error naming the field and the accepted values. So a proxy that left
// the key to the config keeps its key when the config gains another
// (which the field, immutable once set, could not be told afterwards).
func Pick(field, key, recorded string, keys []string, cfg *Config) (string, error) {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	if key == "" && recorded != "" && slices.Contains(sorted, recorded) {
		return recorded, nil
	}
	if key == "" {
		switch len(sorted) {
		case 1:
			return sorted[0], nil
		case 0:
			return "", errors.Errorf("%s: %s has none to choose from", field, cfg.Name)
		default:
			return "", errors.Errorf("%s is required: %s has several (%s)%s", field, cfg.Name, strings.Join(sorted, ", "), fixedOnceSet(recorded, "added to"))
		}
	}
	if !slices.Contains(sorted, key) {
		return "", errors.Errorf("%s: %q is not in %s: want one of %s%s", field, key, cfg.Name, strings.Join(sorted, ", "), fixedOnceSet(recorded, "changed on"))
	}
	return key, nil
}

// fixedOnceSet is the way out of Pick's refusal for a resource that made
// no instance with a key (recorded empty): admission keeps the placement
// fields as they were created, so the fix is a new resource.
func fixedOnceSet(recorded, verb string) string {
	if recorded != "" {
		return ""
	}
	return " (the field cannot be " + verb + " this resource: delete it and create it again with one of those; no instance was made)"
}

// Recorded is the placement status records for an instance (o, with the
// kind's location field), the keys Pick falls back to.
func Recorded(o *spec.ProxyObservation, location func(*spec.Placement) *string) proxy.Placement {
	if o == nil || o.Placement == nil {
		return proxy.Placement{}
	}
	p := proxy.Placement{MachineType: o.Placement.MachineType, Image: o.Placement.Image}
	if location != nil {
		if l := location(o.Placement); l != nil {
			p.Location = *l
		}
	}
	return p
}

// Keys returns the keys of a catalogue.
func Keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
