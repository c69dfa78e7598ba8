package gcp

import (
	"strings"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
)

// OpRef names one Compute Engine operation with its scope: exactly one of
// Zone and Region is set for zonal and regional operations, neither for
// global ones.
type OpRef struct {
	Zone   string
	Region string
	Name   string
}

// String is the scoped form kept in status.atProvider.operation:
// zones/<zone>/operations/<name>, regions/<region>/operations/<name> or
// global/operations/<name>.
func (o OpRef) String() string { return strings.Join(o.segments(), "/") }

// segments is the operation's path below the project.
func (o OpRef) segments() []string {
	switch {
	case o.Zone != "":
		return []string{"zones", o.Zone, "operations", o.Name}
	case o.Region != "":
		return []string{"regions", o.Region, "operations", o.Name}
	}
	return []string{"global", "operations", o.Name}
}

// parseOpRef reads the scoped form; ok is false for anything else.
func parseOpRef(s string) (OpRef, bool) {
	p := strings.Split(s, "/")
	switch {
	case len(p) == 4 && p[0] == "zones" && p[2] == "operations" && p[1] != "" && p[3] != "":
		return OpRef{Zone: p[1], Name: p[3]}, true
	case len(p) == 4 && p[0] == "regions" && p[2] == "operations" && p[1] != "" && p[3] != "":
		return OpRef{Region: p[1], Name: p[3]}, true
	case len(p) == 3 && p[0] == "global" && p[1] == "operations" && p[2] != "":
		return OpRef{Name: p[2]}, true
	}
	return OpRef{}, false
}

// opRefOf is the OpRef of an operation the API returned; its zone and
// region fields are URLs.
func opRefOf(op *computeapi.Operation) OpRef {
	return OpRef{Zone: lastSegment(op.GetZone()), Region: lastSegment(op.GetRegion()), Name: op.GetName()}
}

// joinOps is the status form of several operations in flight (an instance
// insert and a firewall insert, say): space-separated scoped names.
func joinOps(ops []OpRef) string {
	s := make([]string, 0, len(ops))
	for _, o := range ops {
		s = append(s, o.String())
	}
	return strings.Join(s, " ")
}

// splitOps reads joinOps' form, skipping what does not parse (a status
// written by another version).
func splitOps(s string) []OpRef {
	var out []OpRef
	for _, f := range strings.Fields(s) {
		if o, ok := parseOpRef(f); ok {
			out = append(out, o)
		}
	}
	return out
}
