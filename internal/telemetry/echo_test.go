package telemetry

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestWithoutMetadataValues: what is cut from a message of Compute
// Engine, and what stays.
func TestWithoutMetadataValues(t *testing.T) {
	cases := map[string]struct {
		in, want string
	}{
		"whole metadata": {
			in:   fmt.Sprintf("Invalid value for field 'resource.metadata': '{  \"item\": [{    \"key\": \"user-data\",    \"value\": %q  }]}'. Metadata has duplicate keys.", "#cloud-config\nsecret"),
			want: "Invalid value for field 'resource.metadata': " + MetadataValueNotShown,
		},
		"an item's value": {
			in:   "Invalid value for field 'resource.metadata.items[2].value': 'secret'. Must be at most 262144 bytes.",
			want: "Invalid value for field 'resource.metadata.items[2].value': " + MetadataValueNotShown,
		},
		"setMetadata's items": {
			in:   "Invalid value for field 'resource.items[0].value': 'secret'.",
			want: "Invalid value for field 'resource.items[0].value': " + MetadataValueNotShown,
		},
		"another field keeps its value": {
			in:   "Invalid value for field 'resource.machineType': 'zones/z/machineTypes/x'. Machine type not found.",
			want: "Invalid value for field 'resource.machineType': 'zones/z/machineTypes/x'. Machine type not found.",
		},
		"metadata after another field": {
			in:   "Invalid value for field 'resource.machineType': 'zones/z/machineTypes/x'. Invalid value for field 'resource.metadata': 'secret'.",
			want: "Invalid value for field 'resource.machineType': 'zones/z/machineTypes/x'. Invalid value for field 'resource.metadata': " + MetadataValueNotShown,
		},
		"no field": {
			in:   "Quota 'CPUS' exceeded.",
			want: "Quota 'CPUS' exceeded.",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, WithoutMetadataValues(tc.in)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestWireHidesEchoedMetadata: a refusal of Compute Engine that quotes
// the metadata it was sent (cloud-init, the htpasswd, the TLS key) shows
// in the wire log without it, in both places the answer carries it.
func TestWireHidesEchoedMetadata(t *testing.T) {
	const s = "S3NT1NEL-echo-8e1f3a"
	msg := fmt.Sprintf("Invalid value for field 'resource.metadata': '{  \"item\": [{    \"key\": \"user-data\",    \"value\": %q  }]}'. Metadata has duplicate keys.", "#cloud-config\n"+s)
	body, err := json.Marshal(map[string]any{"error": map[string]any{"code": 400, "message": msg,
		"errors": []any{map[string]any{"domain": "global", "reason": "invalid", "message": msg}}}})
	if err != nil {
		t.Fatal(err)
	}
	got := redactBody("application/json; charset=UTF-8", body, int64(len(body)))
	if strings.Contains(got, s) {
		t.Errorf("the wire log shows the metadata refused: %s", got)
	}
	if want := "Invalid value for field 'resource.metadata': " + MetadataValueNotShown; strings.Count(got, want) != 2 {
		t.Errorf("the wire log shows %s; want the refused field named twice", got)
	}
}
