package main

// Every request the provider sends to its API server is counted by verb
// and resource, in the metric egressproxy_bench_requests_total{verb,
// resource}, so the benchmarks can say where the provider's requests go
// (client-go's own rest_client_requests_total has no resource).

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// countRequests is a Hooks.Configure that counts the requests.
func countRequests() func(*rest.Config) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressproxy_bench_requests_total",
		Help: "Requests to the API server by verb (LIST and WATCH told apart from GET) and resource (with its subresource).",
	}, []string{"verb", "resource"})
	metrics.Registry.MustRegister(requests)
	return func(cfg *rest.Config) {
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripper(func(r *http.Request) (*http.Response, error) {
				verb, resource := classify(r)
				requests.WithLabelValues(verb, resource).Inc()
				return rt.RoundTrip(r)
			})
		})
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// classify names a request's verb and resource from its path:
// /api/v1/[namespaces/NS/]RESOURCE[/NAME[/SUB]] and
// /apis/GROUP/VERSION/[namespaces/NS/]RESOURCE[/NAME[/SUB]].
func classify(r *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return r.Method, "(" + r.URL.Path + ")"
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	if len(parts) == 0 {
		return r.Method, "(discovery)"
	}
	resource = parts[0]
	if len(parts) >= 3 {
		resource += "/" + parts[2]
	}
	verb = r.Method
	switch {
	case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
		verb = "WATCH"
	case r.Method == http.MethodGet && len(parts) == 1:
		verb = "LIST"
	}
	return verb, resource
}
