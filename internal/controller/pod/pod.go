// Package pod binds the PodProxy kind (both scopes) to the kubernetes
// backend.
package pod

import (
	ctrl "sigs.k8s.io/controller-runtime"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Kind is the PodProxy binding.
var Kind = external.Kind[spec.PodProxyParameters]{
	Name:    "PodProxy",
	Backend: "kubernetes",
	Proxy:   func(p *spec.PodProxyParameters) *spec.ProxySettings { return &p.Proxy },
	Request: request,
	Connect: external.NotAvailable("kubernetes"),
}

func request(_ *external.Config, p *spec.PodProxyParameters, req *proxy.Request) error {
	if p.Service != nil {
		req.Exposure.ServiceType = p.Service.Type
	}
	return nil
}

// Setup registers the PodProxy controllers of both scopes.
func Setup(mgr ctrl.Manager, o external.Options, sh *external.Shared) error {
	return external.Setup(mgr, o, sh, Kind, nsproxy.PodProxyGroupVersionKind, clusterproxy.PodProxyGroupVersionKind)
}
