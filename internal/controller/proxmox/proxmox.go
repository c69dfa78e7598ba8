// Package proxmox binds the ProxmoxProxy kind (both scopes) to the proxmox
// backend.
package proxmox

import (
	ctrl "sigs.k8s.io/controller-runtime"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Kind is the ProxmoxProxy binding.
var Kind = external.Kind[spec.ProxmoxProxyParameters]{
	Name:          "ProxmoxProxy",
	Backend:       "proxmox",
	LocationField: "node",
	Proxy:         func(p *spec.ProxmoxProxyParameters) *spec.ProxySettings { return &p.Proxy },
	Request:       request,
	Connect:       external.NotAvailable("proxmox"),
}

func request(cfg *external.Config, p *spec.ProxmoxProxyParameters, req *proxy.Request) error {
	pve := cfg.Spec.Proxmox
	var err error
	if req.Placement.Location, err = external.Pick("spec.forProvider.node", p.Node, pve.Nodes, cfg); err != nil {
		return err
	}
	if req.Placement.MachineType, err = external.Pick("spec.forProvider.machineType", p.MachineType, external.Keys(pve.MachineTypes), cfg); err != nil {
		return err
	}
	if req.Placement.Image, err = external.Pick("spec.forProvider.image", p.Image, external.Keys(pve.Templates), cfg); err != nil {
		return err
	}
	req.CloudInit = p.CloudInit
	return nil
}

// Setup registers the ProxmoxProxy controllers of both scopes.
func Setup(mgr ctrl.Manager, o external.Options, sh *external.Shared) error {
	return external.Setup(mgr, o, sh, Kind, nsproxy.ProxmoxProxyGroupVersionKind, clusterproxy.ProxmoxProxyGroupVersionKind)
}
