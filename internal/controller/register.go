// Package controller registers every controller of the provider.
package controller

import (
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/config"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/controller/orphans"
	"github.com/egressproxy/provider-egressproxy/internal/controller/pod"
	"github.com/egressproxy/provider-egressproxy/internal/controller/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/health"
)

// HealthOptions configure the ProviderConfig health checks.
type HealthOptions struct {
	// Interval between two checks of one config.
	Interval time.Duration
	// Timeout of one check.
	Timeout time.Duration
	// OrphanInterval is how often each config's backend is swept for
	// orphans; zero turns the sweep off.
	OrphanInterval time.Duration
}

// Setup registers the proxy controllers of every kind in both scopes, the
// config usage controllers and the config health controllers.
func Setup(mgr ctrl.Manager, o external.Options, ho HealthOptions) error {
	sh := external.NewShared(mgr, o)
	podKind := pod.NewKind(mgr)
	for _, setup := range []func(ctrl.Manager, external.Options, *external.Shared) error{
		kvm.Setup, proxmox.Setup, gcp.Setup, podKind.Setup,
	} {
		if err := setup(mgr, o, sh); err != nil {
			return err
		}
	}
	if err := config.Setup(mgr, sh.ReconcilerManager(mgr), o.Options); err != nil {
		return err
	}
	configs := external.ConfigReader{Kube: mgr.GetClient(), SecretReader: mgr.GetAPIReader(), InstallationID: o.InstallationID}
	configKinds := []schema.GroupVersionKind{nsv1alpha1.ProviderConfigGroupVersionKind, nsv1alpha1.ClusterProviderConfigGroupVersionKind, clusterv1alpha1.ProviderConfigGroupVersionKind}
	if err := health.Setup(mgr, health.Reconciler{
		Kube:    mgr.GetClient(),
		Configs: configs,
		Connectors: map[string]health.Connector{
			kvm.Kind.Backend:     kvm.Kind.Connect,
			proxmox.Kind.Backend: proxmox.Kind.Connect,
			gcp.Kind.Backend:     gcp.Kind.Connect,
			podKind.Backend:      podKind.Connect,
		},
		Interval: ho.Interval,
		Timeout:  ho.Timeout,
	}, o.Logger, configKinds...); err != nil {
		return err
	}
	return orphans.Setup(mgr, orphans.Sweeper{
		Kube:    mgr.GetClient(),
		Configs: configs,
		Connectors: map[string]orphans.Connector{
			kvm.Kind.Backend:     kvm.Kind.Connect,
			proxmox.Kind.Backend: proxmox.Kind.Connect,
			gcp.Kind.Backend:     gcp.Kind.Connect,
			podKind.Backend:      podKind.Connect,
		},
		Kinds: map[string][]schema.GroupVersionKind{
			kvm.Kind.Backend:     {nsproxy.KVMProxyGroupVersionKind, clusterproxy.KVMProxyGroupVersionKind},
			proxmox.Kind.Backend: {nsproxy.ProxmoxProxyGroupVersionKind, clusterproxy.ProxmoxProxyGroupVersionKind},
			gcp.Kind.Backend:     {nsproxy.GCPProxyGroupVersionKind, clusterproxy.GCPProxyGroupVersionKind},
			podKind.Backend:      {nsproxy.PodProxyGroupVersionKind, clusterproxy.PodProxyGroupVersionKind},
		},
		Interval: ho.OrphanInterval,
		Timeout:  ho.Timeout,
		Log:      o.Logger,
	}, configKinds...)
}
