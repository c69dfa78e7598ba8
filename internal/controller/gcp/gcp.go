// Package gcp binds the GCPProxy kind (both scopes) to the gcp backend.
package gcp

import (
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	ctrl "sigs.k8s.io/controller-runtime"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Kind is the GCPProxy binding.
var Kind = external.Kind[spec.GCPProxyParameters]{
	Name:          "GCPProxy",
	Backend:       "gcp",
	LocationField: "zone",
	Proxy:         func(p *spec.GCPProxyParameters) *spec.ProxySettings { return &p.Proxy },
	Request:       request,
	Connect:       external.NotAvailable("gcp"),
}

func request(cfg *external.Config, p *spec.GCPProxyParameters, req *proxy.Request) error {
	g := cfg.Spec.GCP
	zone := p.Zone
	switch {
	case zone == "" && len(g.Zones) > 0:
		zone = g.Zones[0]
	case zone == "":
		return errors.Errorf("spec.forProvider.zone is required: %s lists no zones to default to", cfg.Name)
	case len(g.Zones) > 0:
		if _, err := external.Pick("spec.forProvider.zone", zone, g.Zones, cfg); err != nil {
			return err
		}
	}
	req.Placement.Location = zone
	var err error
	if req.Placement.MachineType, err = external.Pick("spec.forProvider.machineType", p.MachineType, external.Keys(g.MachineTypes), cfg); err != nil {
		return err
	}
	if req.Placement.Image, err = external.Pick("spec.forProvider.image", p.Image, external.Keys(g.Images), cfg); err != nil {
		return err
	}
	req.CloudInit = p.CloudInit
	req.Exposure.AddressType = "Ephemeral"
	req.Exposure.ManageFirewall = true
	if p.Address != nil {
		req.Exposure.AddressType = p.Address.Type
		req.Exposure.RetainAddress = p.Address.Retain
	}
	if p.Firewall != nil {
		req.Exposure.ManageFirewall = p.Firewall.Manage
	}
	return nil
}

// Setup registers the GCPProxy controllers of both scopes.
func Setup(mgr ctrl.Manager, o external.Options, sh *external.Shared) error {
	return external.Setup(mgr, o, sh, Kind, nsproxy.GCPProxyGroupVersionKind, clusterproxy.GCPProxyGroupVersionKind)
}
