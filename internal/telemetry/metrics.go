// Package telemetry is the provider's observability base: the backend-call
// histogram, OpenTelemetry tracing configured from the standard OTEL_
// environment variables, and the driver decorator that feeds both.
package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// BackendCalls times every driver call by backend, method and error class
// (ErrorClass: none on success). The label is error_class, not class,
// which is what an EgressProxy's spec.class means.
var BackendCalls = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Namespace: "egressproxy",
	Name:      "backend_call_duration_seconds",
	Help:      "Duration of backend driver calls by backend, method and error class (none on success; not_found, transient, permanent, quota).",
	Buckets:   []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
}, []string{"backend", "method", "error_class"})

func init() {
	// controller-runtime's registry is what the manager serves on /metrics.
	metrics.Registry.MustRegister(BackendCalls, BackendRequests, ConfigTargetHealthy, Orphans)
}

// ConfigTargetHealthy is 1 when a ProviderConfig's target (a host, node,
// project or API server) passed its last health check and 0 when it did
// not, by config kind, namespace (empty for cluster-scoped configs), name,
// backend and target.
var ConfigTargetHealthy = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Namespace: "egressproxy",
	Name:      "provider_config_target_healthy",
	Help:      "1 when the ProviderConfig's backend target passed its last health check, 0 when it did not.",
}, []string{"kind", "namespace", "name", "backend", "target"})

// ForgetConfig removes the health series of one config: those of the given
// targets, or all of them when targets is nil.
func ForgetConfig(kind, namespace, name string, targets []string) {
	l := prometheus.Labels{"kind": kind, "namespace": namespace, "name": name}
	if targets == nil {
		ConfigTargetHealthy.DeletePartialMatch(l)
		return
	}
	for _, t := range targets {
		l["target"] = t
		ConfigTargetHealthy.DeletePartialMatch(l)
	}
}

// Orphans is how many instances with this installation's mark, whose
// managed resource no longer exists, the last orphan sweep of a config
// found, by backend and config (Kind/name or Kind/namespace/name).
var Orphans = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Namespace: "egressproxy",
	Name:      "orphans",
	Help:      "Instances carrying this installation's mark whose managed resource no longer exists, as the last orphan sweep of the config found them.",
}, []string{"backend", "config"})

// ForgetOrphans removes the orphan series of a config that is gone.
func ForgetOrphans(config string) {
	Orphans.DeletePartialMatch(prometheus.Labels{"config": config})
}

// BackendRequests times every request a driver makes to its backend (a
// libvirt RPC, a Proxmox, Compute Engine or Kubernetes API request: one
// BackendCalls observation is made of several), by backend, call (the
// RPC or API method, never an identifier) and error class.
var BackendRequests = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Namespace: "egressproxy",
	Name:      "backend_request_duration_seconds",
	Help:      "Duration of the requests backend drivers make to their backends (libvirt RPCs, API requests) by backend, call and error class (none on success; not_found, transient, permanent, quota).",
	Buckets:   []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
}, []string{"backend", "call", "error_class"})
