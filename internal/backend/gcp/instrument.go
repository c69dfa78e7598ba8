package gcp

import (
	"context"
	"net/http"
	"strings"

	"github.com/go-logr/logr"

	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// observedTransport is the one decorator on the seam: the client is built
// on it (NewSDK), so every Compute Engine request is a client span
// gcp.<method> (gcp.instances.get), a child of the caller's, one V(1) log
// line "gcp api call" and one
// observation of egressproxy_backend_request_duration_seconds. Nothing of
// a request but its HTTP method, host and API method is recorded, but at
// the wire tier (telemetry.VWire), where the request and its answer are
// logged inside the span, secrets redacted (telemetry.Wire): as the
// driver sends them, before the authenticating transport below adds the
// token.
func observedTransport(rt http.RoundTripper) http.RoundTripper {
	log := func(ctx context.Context) logr.Logger {
		return telemetry.Logger(ctx, logr.FromContextOrDiscard(ctx).WithName("gcp"))
	}
	return telemetry.Transport("gcp", computeMethod, log, telemetry.Wire("gcp", log, rt))
}

// computeCollections are the Compute Engine collections the driver uses;
// a path segment that is one of them is followed by a name, and the last
// segment that is none of them is a custom verb (setLabels, wait).
var computeCollections = map[string]bool{
	"projects": true, "zones": true, "regions": true, "instances": true, "addresses": true,
	"firewalls": true, "operations": true, "networks": true, "subnetworks": true, "machineTypes": true, "images": true,
}

// computeMethod names a Compute Engine REST request as the API's method
// without its service (instances.get, instances.aggregatedList,
// zoneOperations.get, addresses.setLabels), identifiers left out, so
// that it is a span name and a metric label of low cardinality.
func computeMethod(req *http.Request) string {
	segs := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	i := 0
	for i < len(segs) && segs[i] != "projects" {
		i++
	}
	if i == len(segs) {
		return "other"
	}
	var collection, scope, verb string
	named := false
	for i < len(segs) {
		s := segs[i]
		switch {
		case s == "global" || s == "aggregated":
			scope = s
			i++
		case computeCollections[s]:
			collection, named = s, i+1 < len(segs)
			if collection == "zones" || collection == "regions" {
				scope = strings.TrimSuffix(collection, "s")
			}
			i += 2
		default:
			verb = s
			i = len(segs)
		}
	}
	if collection == "operations" {
		collection = scope + "Operations"
	}
	switch {
	case verb != "":
	case scope == "aggregated":
		verb = "aggregatedList"
	case req.Method == http.MethodGet && named:
		verb = "get"
	case req.Method == http.MethodGet:
		verb = "list"
	case req.Method == http.MethodPost:
		verb = "insert"
	case req.Method == http.MethodDelete:
		verb = "delete"
	case req.Method == http.MethodPatch:
		verb = "patch"
	case req.Method == http.MethodPut:
		verb = "update"
	default:
		verb = strings.ToLower(req.Method)
	}
	return collection + "." + verb
}
