package telemetry

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestWithoutMetadataValues: what is cut from a message of Compute
// Engine, and what stays: the value a refusal of a metadata field quotes
// is replaced, the field's name, the reason after the value and other
// fields' refusals stay.
func TestWithoutMetadataValues(t *testing.T) {
	cases := map[string]struct {
		in, want string
	}{
		"whole metadata": {
			in:   fmt.Sprintf("Invalid value for field 'resource.metadata': '{  \"item\": [{    \"key\": \"user-data\",    \"value\": %q  }]}'. Metadata has duplicate keys.", "#cloud-config\nsecret"),
			want: "Invalid value for field 'resource.metadata': " + MetadataValueNotShown + ". Metadata has duplicate keys.",
		},
		"an item's value": {
			in:   "Invalid value for field 'resource.metadata.items[2].value': 'secret'. Must be at most 262144 bytes.",
			want: "Invalid value for field 'resource.metadata.items[2].value': " + MetadataValueNotShown + ". Must be at most 262144 bytes.",
		},
		"setMetadata's items": {
			in:   "Invalid value for field 'resource.items[0].value': 'secret'.",
			want: "Invalid value for field 'resource.items[0].value': " + MetadataValueNotShown + ".",
		},
		// As Compute Engine words a refused key (two spaces, and a
		// reason that quotes a regex).
		"a key, the reason quoting": {
			in:   "Invalid value for field 'resource.metadata.items[1].key': '#'.  Must be a match of regex '[a-zA-Z0-9-_]{1,128}'",
			want: "Invalid value for field 'resource.metadata.items[1].key': " + MetadataValueNotShown + ".  Must be a match of regex '[a-zA-Z0-9-_]{1,128}'",
		},
		"another field keeps its value": {
			in:   "Invalid value for field 'resource.machineType': 'zones/z/machineTypes/x'. Machine type not found.",
			want: "Invalid value for field 'resource.machineType': 'zones/z/machineTypes/x'. Machine type not found.",
		},
		"metadata after another field": {
			in:   "Invalid value for field 'resource.machineType': 'zones/z/machineTypes/x'. Invalid value for field 'resource.metadata': 'secret'. Metadata has duplicate keys.",
			want: "Invalid value for field 'resource.machineType': 'zones/z/machineTypes/x'. Invalid value for field 'resource.metadata': " + MetadataValueNotShown + ". Metadata has duplicate keys.",
		},
		// Without the closing quote and period nothing tells the value's
		// end: all of it goes.
		"no end to the value": {
			in:   "Invalid value for field 'resource.metadata': 'secret",
			want: "Invalid value for field 'resource.metadata': " + MetadataValueNotShown,
		},
		"no field": {
			in:   "Quota 'CPUS' exceeded.",
			want: "Quota 'CPUS' exceeded.",
		},
		// A reason not known to be Compute Engine's may be the rest of
		// the value: it goes with it.
		"an unknown reason": {
			in:   "Invalid value for field 'resource.metadata': 'secret'. Something else went wrong.",
			want: "Invalid value for field 'resource.metadata': " + MetadataValueNotShown,
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

// TestWithoutMetadataValuesSentinels: whatever a metadata value holds
// (quotes, backslashes, newlines, the closing quote and period, words of
// a refusal of its own), in each form Compute Engine quotes it, no part
// of it shows, and the reason after it does.
func TestWithoutMetadataValuesSentinels(t *testing.T) {
	const s = "S3NT1NEL-7d2c"
	const why = "Must be at most 262144 bytes."
	values := map[string]string{
		"plain":            s,
		"single quotes":    "echo '" + s + "'",
		"double quotes":    `say "` + s + `"`,
		"backslashes":      `C:\` + s + `\`,
		"newlines":         "#cloud-config\nruncmd:\n - " + s + "\n",
		"closing":          "a'. " + s + "'. b",
		"closing at end":   s + "'.",
		"a refusal inside": "x'. Invalid value for field 'resource.machineType': '" + s + "'. Machine type not found.",
	}
	forms := map[string]func(v string) string{
		"an item's value": func(v string) string {
			return "Invalid value for field 'resource.metadata.items[0].value': '" + v + "'. " + why
		},
		"setMetadata's items": func(v string) string {
			return "Invalid value for field 'resource.items[3].value': '" + v + "'. " + why
		},
		"whole metadata": func(v string) string {
			return fmt.Sprintf("Invalid value for field 'resource.metadata': '{  \"item\": [{    \"key\": \"user-data\",    \"value\": %q  }]}'. %s", v, why)
		},
		"whole metadata, raw": func(v string) string {
			return "Invalid value for field 'resource.metadata': '{\"items\":[{\"key\":\"user-data\",\"value\":\"" + v + "\"}]}'. " + why
		},
		"after another field": func(v string) string {
			return "Invalid value for field 'resource.machineType': 'zones/z/machineTypes/x'. Invalid value for field 'resource.metadata.items[0].value': '" + v + "'. " + why
		},
	}
	// Closed otherwise than by a quote and a period, or cut: what follows
	// a closing quote and period inside the value is the value's.
	unknownEnds := map[string]func(v string) string{
		"a bare closing quote": func(v string) string {
			return "Invalid value for field 'resource.metadata.items[0].value': '" + v + "'"
		},
		"a quote and a comma": func(v string) string {
			return "Invalid value for field 'resource.metadata.items[0].value': '" + v + "', must be at most 262144 bytes"
		},
		"cut": func(v string) string {
			return "Invalid value for field 'resource.metadata.items[0].value': '" + v[:len(v)-1]
		},
	}
	for fn, form := range unknownEnds {
		for vn, v := range map[string]string{"closing inside": "echo 'hi'. " + s + "'", "closing, then words": "a'. " + s + " b'. c"} {
			t.Run(fn+"/"+vn, func(t *testing.T) {
				if got := WithoutMetadataValues(form(v)); strings.Contains(got, s) {
					t.Errorf("the value shows: %q", got)
				}
			})
		}
	}
	for fn, form := range forms {
		for vn, v := range values {
			t.Run(fn+"/"+vn, func(t *testing.T) {
				got := WithoutMetadataValues(form(v))
				if strings.Contains(got, s) {
					t.Errorf("the value shows: %q", got)
				}
				if !strings.HasSuffix(got, MetadataValueNotShown+". "+why) {
					t.Errorf("got %q; want the value replaced and the reason after it kept", got)
				}
				if fn == "after another field" && !strings.HasPrefix(got, "Invalid value for field 'resource.machineType': 'zones/z/machineTypes/x'. ") {
					t.Errorf("got %q; want the other field's refusal kept", got)
				}
			})
		}
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
	if want := "Invalid value for field 'resource.metadata': " + MetadataValueNotShown + ". Metadata has duplicate keys."; strings.Count(got, want) != 2 {
		t.Errorf("the wire log shows %s; want the refused field and the reason, twice", got)
	}
}
