package telemetry

import (
	"regexp"
	"strings"
)

// invalidField is Compute Engine's refusal of a field, which goes on to
// quote the value refused: "Invalid value for field 'F': 'V'. Why.".
var invalidField = regexp.MustCompile(`Invalid value for field '([^']*)': `)

// valueEnd is where a quoted value may end: its closing quote, then the
// period and the space (or the end) that start Compute Engine's reason.
var valueEnd = regexp.MustCompile(`'\.(?:\s|$)`)

// knownReason is what may follow a hidden value, from its period on:
// nothing, or one of the reasons Compute Engine gives for a metadata
// field, exactly. The value may hold its own closing quote and period
// and go on (and Compute Engine may close it with a bare quote, or cut
// it), so text after the last of them is kept only when it is one of
// these: anything else could be the rest of the value.
var knownReason = regexp.MustCompile(`^\.(?:\s+(?:Metadata has duplicate keys\.|Must be at most \d+ bytes\.|Must be a match of regex '\[a-zA-Z0-9-_\]\{1,128\}'\.?))?\s*$`)

// MetadataValueNotShown stands for an instance metadata value a message
// of Compute Engine quoted.
const MetadataValueNotShown = "(the value is not shown: metadata holds secrets)"

// WithoutMetadataValues is msg, a message of Compute Engine, with the
// value it quotes of a refused metadata field replaced by
// MetadataValueNotShown. The field's name, the reason after the value and
// the refusals of other fields before it stay; so do other fields' values
// (a machine type, a zone), which are the config's.
//
// Compute Engine quotes the value as it is ('V'. Why), so the value
// (cloud-init, the htpasswd, a TLS key) may hold quotes, newlines and
// the closing quote and period themselves: it is taken to end at the
// last closing quote and period of the message, and what follows is
// kept only when it is a reason Compute Engine gives (knownReason);
// otherwise all that follows the field's name is hidden. Nothing of the
// value can then show.
func WithoutMetadataValues(msg string) string {
	var out strings.Builder
	for {
		// Every refusal the message holds: one of another field may
		// come first.
		m := metadataRefusal(msg)
		if m == nil {
			out.WriteString(msg)
			return out.String()
		}
		out.WriteString(msg[:m[1]])
		out.WriteString(MetadataValueNotShown)
		rest := msg[m[1]:]
		ends := valueEnd.FindAllStringIndex(rest, -1)
		if !strings.HasPrefix(rest, "'") || len(ends) == 0 || ends[len(ends)-1][0] == 0 {
			return out.String()
		}
		// From the period on: the reason, if it is one.
		msg = rest[ends[len(ends)-1][0]+1:]
		if !knownReason.MatchString(msg) {
			return out.String()
		}
	}
}

// metadataRefusal is the index pairs (invalidField's) of the first
// refusal of a metadata field in msg, or nil.
func metadataRefusal(msg string) []int {
	for _, m := range invalidField.FindAllStringSubmatchIndex(msg, -1) {
		field := msg[m[2]:m[3]]
		if strings.Contains(strings.ToLower(field), "metadata") || strings.HasPrefix(field, "resource.items") {
			return m
		}
	}
	return nil
}
