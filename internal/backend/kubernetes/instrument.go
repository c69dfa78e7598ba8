package kubernetes

import (
	"context"
	"net/http"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Observed is a copy of cfg whose requests go through the one decorator
// on the seam (rest.Config.WrapTransport): every request to the API server
// is a client span kubernetes.<resource>.<verb> (kubernetes.pods.list), a
// child of the caller's, one V(1) log line "kubernetes api call" and one
// observation of egressproxy_backend_request_duration_seconds. Reads the
// manager's cache serves make no request and so no span. Nothing of a
// request but its HTTP method, host, resource and verb is recorded: never
// a header (the bearer token), a query or a body.
func Observed(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	prev := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return telemetry.Transport("kubernetes", apiMethod, func(ctx context.Context) logr.Logger {
			return telemetry.Logger(ctx, logr.FromContextOrDiscard(ctx).WithName("kubernetes"))
		}, rt)
	}
	return cfg
}

// apiMethod names a Kubernetes API request as <resource>.<verb> with the
// API's verbs (get, list, watch, create, update, patch, delete,
// deletecollection) and a subresource after a slash (deployments/status),
// names and namespaces left out; /version and discovery are version.get
// and discovery.get.
func apiMethod(req *http.Request) string {
	segs := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var rest []string
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		rest = segs[2:]
	case len(segs) >= 3 && segs[0] == "apis":
		rest = segs[3:]
	case len(segs) == 1 && segs[0] == "version":
		return "version.get"
	default:
		return "discovery.get"
	}
	if len(rest) == 0 {
		return "discovery.get"
	}
	if rest[0] == "namespaces" && len(rest) >= 3 {
		rest = rest[2:]
	}
	resource, named := rest[0], len(rest) >= 2
	if len(rest) >= 3 {
		resource += "/" + rest[2]
	}
	var verb string
	switch req.Method {
	case http.MethodGet:
		switch {
		case named:
			verb = "get"
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(req.Method)
	}
	return resource + "." + verb
}
