package telemetry

import (
	"regexp"
	"strings"
)

// invalidField is Compute Engine's refusal of a field, which goes on to
// quote the value refused: "Invalid value for field 'F': 'V'. Why.".
var invalidField = regexp.MustCompile(`Invalid value for field '([^']*)': `)

// MetadataValueNotShown stands for an instance metadata value a message
// of Compute Engine quoted.
const MetadataValueNotShown = "(the value is not shown: metadata holds secrets)"

// WithoutMetadataValues is msg, a message of Compute Engine, with the
// value it quotes of a refused metadata field cut, along with all that
// follows it: the value (cloud-init, the htpasswd, a TLS key) may hold
// any text, so nothing after its start can be told apart from it. The
// field's name stays. Other fields' values (a machine type, a zone) are
// the config's and stay.
func WithoutMetadataValues(msg string) string {
	// Every refusal the message holds: one of another field may come
	// first.
	for _, m := range invalidField.FindAllStringSubmatchIndex(msg, -1) {
		field := msg[m[2]:m[3]]
		if strings.Contains(strings.ToLower(field), "metadata") || strings.HasPrefix(field, "resource.items") {
			return msg[:m[1]] + MetadataValueNotShown
		}
	}
	return msg
}
