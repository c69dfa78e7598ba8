// Package controller registers every controller of the provider.
package controller

import (
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/config"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
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
	return health.Setup(mgr, health.Reconciler{
		Kube:    mgr.GetClient(),
		Configs: external.ConfigReader{Kube: mgr.GetClient(), SecretReader: mgr.GetAPIReader(), InstallationID: o.InstallationID},
		Connectors: map[string]health.Connector{
			kvm.Kind.Backend:     kvm.Kind.Connect,
			proxmox.Kind.Backend: proxmox.Kind.Connect,
			gcp.Kind.Backend:     gcp.Kind.Connect,
			podKind.Backend:      podKind.Connect,
		},
		Interval: ho.Interval,
		Timeout:  ho.Timeout,
	}, o.Logger, nsv1alpha1.ProviderConfigGroupVersionKind, nsv1alpha1.ClusterProviderConfigGroupVersionKind, clusterv1alpha1.ProviderConfigGroupVersionKind)
}
