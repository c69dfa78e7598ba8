// Package kvm binds the KVMProxy kind (both scopes) to the kvm backend.
package kvm

import (
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Kind is the KVMProxy binding.
var Kind = external.Kind[spec.KVMProxyParameters]{
	Name:          "KVMProxy",
	Backend:       "kvm",
	LocationField: "host",
	Proxy:         func(p *spec.KVMProxyParameters) *spec.ProxySettings { return &p.Proxy },
	Request:       request,
	Connect:       external.NotAvailable("kvm"),
}

func request(cfg *external.Config, p *spec.KVMProxyParameters, req *proxy.Request) error {
	kvm := cfg.Spec.KVM
	hosts := make([]string, 0, len(kvm.Hosts))
	for _, h := range kvm.Hosts {
		hosts = append(hosts, h.Name)
	}
	var err error
	if req.Placement.Location, err = external.Pick("spec.forProvider.host", p.Host, hosts, cfg); err != nil {
		return err
	}
	if req.Placement.MachineType, err = external.Pick("spec.forProvider.machineType", p.MachineType, external.Keys(kvm.MachineTypes), cfg); err != nil {
		return err
	}
	// An image is a catalogue key or a URL of the image itself.
	if strings.HasPrefix(p.Image, "http://") || strings.HasPrefix(p.Image, "https://") {
		req.Placement.Image = p.Image
	} else if req.Placement.Image, err = external.Pick("spec.forProvider.image", p.Image, external.Keys(kvm.Images), cfg); err != nil {
		return err
	}
	req.CloudInit = p.CloudInit
	return nil
}

// Setup registers the KVMProxy controllers of both scopes.
func Setup(mgr ctrl.Manager, o external.Options, sh *external.Shared) error {
	return external.Setup(mgr, o, sh, Kind, nsproxy.KVMProxyGroupVersionKind, clusterproxy.KVMProxyGroupVersionKind)
}
