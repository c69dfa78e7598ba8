package computeapi_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
)

func ptr[T any](v T) *T { return &v }

// TestTypesAreComputeEngines walks every type against its schema in
// Compute Engine's discovery document (the one google.golang.org/api
// ships): each field's JSON name is a member of the schema, with the
// same JSON type, down to the leaves. A misspelt tag fails here.
func TestTypesAreComputeEngines(t *testing.T) {
	d, err := gcptest.LoadDiscovery()
	if err != nil {
		t.Fatal(err)
	}
	for schema, v := range map[string]any{
		"Instance":               computeapi.Instance{},
		"Operation":              computeapi.Operation{},
		"Address":                computeapi.Address{},
		"RegionSetLabelsRequest": computeapi.RegionSetLabelsRequest{},
		"Firewall":               computeapi.Firewall{},
		"FirewallList":           computeapi.FirewallList{},
		"Region":                 computeapi.Region{},
		"GuestAttributes":        computeapi.GuestAttributes{},
		"InstanceAggregatedList": computeapi.InstanceAggregatedList{},
		"AddressAggregatedList":  computeapi.AddressAggregatedList{},
	} {
		walkSchema(t, d, schema, reflect.TypeOf(v), &gcptest.Property{Ref: schema})
	}
}

func walkSchema(t *testing.T, d *gcptest.Discovery, path string, typ reflect.Type, p *gcptest.Property) {
	t.Helper()
	if p.Ref != "" {
		if p = d.Schemas[p.Ref]; p == nil {
			t.Errorf("%s: the discovery document has no such schema", path)
			return
		}
	}
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	want := map[reflect.Kind]string{
		reflect.Struct: "object", reflect.Map: "object", reflect.Slice: "array", reflect.String: "string",
		reflect.Bool: "boolean", reflect.Int32: "integer", reflect.Float64: "number",
	}[typ.Kind()]
	if p.Type != want {
		t.Errorf("%s: a Go %s is a JSON %q; Compute Engine's is a %q", path, typ, want, p.Type)
		return
	}
	switch typ.Kind() {
	case reflect.Struct:
		for f := range typ.Fields() {
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			sub := p.Properties[name]
			if sub == nil {
				t.Errorf("%s.%s (%s.%s): Compute Engine has no such member", path, name, typ.Name(), f.Name)
				continue
			}
			if strings.Contains(opts, "string") {
				// An integer sent as a JSON string: Compute's int64 and
				// uint64.
				if sub.Type != "string" || (sub.Format != "int64" && sub.Format != "uint64") || f.Type.Elem().Kind() != reflect.Int64 {
					t.Errorf("%s.%s: an int64 as a string; Compute Engine's is a %s (%s)", path, name, sub.Type, sub.Format)
				}
				continue
			}
			walkSchema(t, d, path+"."+name, f.Type, sub)
		}
	case reflect.Slice:
		walkSchema(t, d, path+"[]", typ.Elem(), p.Items)
	case reflect.Map:
		if p.AdditionalProperties == nil {
			t.Errorf("%s: a map; Compute Engine's is an object with fixed members", path)
			return
		}
		walkSchema(t, d, path+"{}", typ.Elem(), p.AdditionalProperties)
	}
}

// TestAnInstanceKeepsWhatItDoesNotName: an instance read and encoded
// again (the body of instances.update) carries every member it was read
// with, nested ones too, and the fields the driver changed as changed.
func TestAnInstanceKeepsWhatItDoesNotName(t *testing.T) {
	const (
		head = `{"name":"i","fingerprint":"f1","canIpForward":false,"scheduling":{"preemptible":true},`
		tail = `"networkInterfaces":[{"name":"nic0","stackType":"IPV4_ONLY","accessConfigs":[{"natIP":"192.0.2.1","networkTier":"PREMIUM"}]}],` +
			`"disks":[{"boot":true,"deviceName":"d0","diskSizeGb":"10"}],"tags":{"fingerprint":"t1","items":["x"]}}`
		read = head + `"labels":{"a":"1","gone":"2"},"metadata":{"kind":"compute#metadata","fingerprint":"m1","items":[{"key":"k","value":"v"}]},` + tail
		// The labels replaced (not merged) and the metadata built anew.
		want = head + `"labels":{"a":"1"},"metadata":{"fingerprint":"m1","items":[{"key":"k","value":"w"}]},` + tail
	)
	var inst computeapi.Instance
	if err := json.Unmarshal([]byte(read), &inst); err != nil {
		t.Fatal(err)
	}
	same, err := json.Marshal(&inst)
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, same, []byte(read)) {
		t.Errorf("encoded as read:\n got %s\nwant %s", same, read)
	}
	inst.Labels = map[string]string{"a": "1"}
	inst.Metadata = &computeapi.Metadata{Fingerprint: inst.GetMetadata().Fingerprint, Items: []*computeapi.Items{{Key: ptr("k"), Value: ptr("w")}}}
	changed, err := json.Marshal(&inst)
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, changed, []byte(want)) {
		t.Errorf("encoded after a change:\n got %s\nwant %s", changed, want)
	}
}

// TestAMemberInAnotherCaseIsAField: encoding/json reads a member whose
// name differs from a field's only in case into that field, so it is not
// kept beside it too, and the instance is sent with that member once.
func TestAMemberInAnotherCaseIsAField(t *testing.T) {
	var inst computeapi.Instance
	if err := json.Unmarshal([]byte(`{"NAME":"i","Fingerprint":"f1","other":1}`), &inst); err != nil {
		t.Fatal(err)
	}
	if inst.GetName() != "i" || inst.GetFingerprint() != "f1" {
		t.Fatalf("read name %q, fingerprint %q; want i and f1", inst.GetName(), inst.GetFingerprint())
	}
	b, err := json.Marshal(&inst)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"name":"i","fingerprint":"f1","other":1}`; !jsonEqual(t, b, []byte(want)) {
		t.Errorf("encoded %s; want %s", b, want)
	}
}

// TestExplicitValuesAreSent: what the driver sets is sent even when it is
// a zero value, in Compute's encoding.
func TestExplicitValuesAreSent(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want string
	}{
		{&computeapi.Firewall{Disabled: ptr(false)}, `{"disabled":false}`},
		{&computeapi.Firewall{}, `{}`},
		{&computeapi.AttachedDiskInitializeParams{DiskSizeGb: ptr(int64(10))}, `{"diskSizeGb":"10"}`},
		{&computeapi.RegionSetLabelsRequest{LabelFingerprint: ptr(""), Labels: map[string]string{}}, `{"labelFingerprint":"","labels":{}}`},
		{&computeapi.Instance{Name: ptr("i"), Metadata: &computeapi.Metadata{Fingerprint: ptr("m")}}, `{"name":"i","metadata":{"fingerprint":"m"}}`},
	} {
		got, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		if !jsonEqual(t, got, []byte(tc.want)) {
			t.Errorf("%T encodes as %s; want %s", tc.v, got, tc.want)
		}
	}
}

// TestGettersAreNilSafe: a field of a missing object reads as unset.
func TestGettersAreNilSafe(t *testing.T) {
	var inst *computeapi.Instance
	var op *computeapi.Operation
	if inst.GetName() != "" || inst.GetMetadata().GetItems() != nil || inst.GetNetworkInterfaces() != nil || op.GetError().GetErrors() != nil || op.GetStatus() != "" {
		t.Error("a getter of a nil object returned something")
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}
