package computeapi

import (
	"encoding/json"
	"reflect"
	"strings"
	"sync"
)

// members are the members of a JSON object that its Go type does not
// name, as read.
type members map[string]json.RawMessage

// named are the JSON member names of a struct type's fields.
var named sync.Map // reflect.Type -> map[string]bool

func namesOf(t reflect.Type) map[string]bool {
	if n, ok := named.Load(t); ok {
		return n.(map[string]bool) //nolint:forcetypeassert // Only this function stores, and it stores these.
	}
	n := map[string]bool{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.IsExported() && name != "" && name != "-" {
			n[name] = true
		}
	}
	named.Store(t, n)
	return n
}

// foldsTo says a field's name matches k but for case, as encoding/json
// matches them: the field took its value, and keeping k as well would
// send the member twice.
func foldsTo(k string, names map[string]bool) bool {
	for n := range names {
		if strings.EqualFold(n, k) {
			return true
		}
	}
	return false
}

// decodeKeeping decodes b into v, a pointer to a struct of a type without
// a method of its own, and returns the members no field of it names.
func decodeKeeping(b []byte, v any) (members, error) {
	if err := json.Unmarshal(b, v); err != nil {
		return nil, err
	}
	var all members
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, err
	}
	names := namesOf(reflect.TypeOf(v).Elem())
	for k := range all {
		if names[k] || foldsTo(k, names) {
			delete(all, k)
		}
	}
	if len(all) == 0 {
		return nil, nil
	}
	return all, nil
}

// encodeKeeping encodes v (as decodeKeeping's) with rest beside its fields;
// rest never names one of them.
func encodeKeeping(v any, rest members) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil || len(rest) == 0 {
		return b, err
	}
	var out members
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	for k, m := range rest {
		out[k] = m
	}
	return json.Marshal(out)
}

// The types that keep what they do not name, with their plain forms (the
// same fields, without the methods below, which would recurse).

type (
	plainInstance         Instance
	plainMetadata         Metadata
	plainNetworkInterface NetworkInterface
	plainAccessConfig     AccessConfig
	plainTags             Tags
	plainAttachedDisk     AttachedDisk
)

func (x *Instance) UnmarshalJSON(b []byte) (err error) {
	x.rest, err = decodeKeeping(b, (*plainInstance)(x))
	return err
}

func (x *Instance) MarshalJSON() ([]byte, error) {
	return encodeKeeping((*plainInstance)(x), x.rest)
}

func (x *Metadata) UnmarshalJSON(b []byte) (err error) {
	x.rest, err = decodeKeeping(b, (*plainMetadata)(x))
	return err
}

func (x *Metadata) MarshalJSON() ([]byte, error) {
	return encodeKeeping((*plainMetadata)(x), x.rest)
}

func (x *NetworkInterface) UnmarshalJSON(b []byte) (err error) {
	x.rest, err = decodeKeeping(b, (*plainNetworkInterface)(x))
	return err
}

func (x *NetworkInterface) MarshalJSON() ([]byte, error) {
	return encodeKeeping((*plainNetworkInterface)(x), x.rest)
}

func (x *AccessConfig) UnmarshalJSON(b []byte) (err error) {
	x.rest, err = decodeKeeping(b, (*plainAccessConfig)(x))
	return err
}

func (x *AccessConfig) MarshalJSON() ([]byte, error) {
	return encodeKeeping((*plainAccessConfig)(x), x.rest)
}

func (x *Tags) UnmarshalJSON(b []byte) (err error) {
	x.rest, err = decodeKeeping(b, (*plainTags)(x))
	return err
}

func (x *Tags) MarshalJSON() ([]byte, error) {
	return encodeKeeping((*plainTags)(x), x.rest)
}

func (x *AttachedDisk) UnmarshalJSON(b []byte) (err error) {
	x.rest, err = decodeKeeping(b, (*plainAttachedDisk)(x))
	return err
}

func (x *AttachedDisk) MarshalJSON() ([]byte, error) {
	return encodeKeeping((*plainAttachedDisk)(x), x.rest)
}
