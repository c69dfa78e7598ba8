// Package controller registers every controller of the provider.
package controller

import (
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/config"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/controller/health"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/controller/orphans"
	"github.com/egressproxy/provider-egressproxy/internal/controller/pod"
	"github.com/egressproxy/provider-egressproxy/internal/controller/proxmox"
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

// Bindings are the provider's kinds, each bound to its backend. A steady
// Proxmox VM's or GCP instance's Get answers from a shared listing at most
// an eighth of a poll old (internal/backend/batch).
func Bindings(mgr ctrl.Manager, o external.Options) []external.Binding {
	return []external.Binding{
		kvm.New(mgr, kvm.Options{}),
		proxmox.New(mgr, proxmox.Options{ObserveMaxAge: o.PollInterval / 8}),
		gcp.New(mgr, gcp.Options{ObserveMaxAge: o.PollInterval / 8}),
		pod.New(mgr, pod.Options{Networks: o.ClusterNetworks}),
	}
}

// Setup registers the proxy controllers of every kind in both scopes, the
// config usage controllers and the config health controllers.
func Setup(mgr ctrl.Manager, o external.Options, ho HealthOptions) error {
	return SetupBindings(mgr, o, ho, Bindings(mgr, o)...)
}

// SetupBindings is Setup with the given kinds: every kind's controllers,
// and the usage, health and orphan controllers of the configs, whose
// backends are those of the kinds.
func SetupBindings(mgr ctrl.Manager, o external.Options, ho HealthOptions, bindings ...external.Binding) error {
	sh := external.NewShared(mgr, o)
	configs := external.ConfigReader{Kube: mgr.GetClient(), SecretReader: mgr.GetAPIReader(), InstallationID: o.InstallationID, Guard: o.TenantGuard}
	kinds := map[string][]schema.GroupVersionKind{}
	var namespaced []schema.GroupVersionKind
	for _, b := range bindings {
		if err := b.Setup(mgr, o, sh); err != nil {
			return err
		}
		backend, gvks := b.Describe()
		configs.Backends = append(configs.Backends, backend)
		kinds[backend.Name] = append(kinds[backend.Name], gvks...)
		for _, gvk := range gvks {
			if gvk.Group == nsproxy.Group {
				namespaced = append(namespaced, gvk)
			}
		}
	}
	if err := config.Setup(mgr, sh.ReconcilerManager(mgr), o.Options, namespaced); err != nil {
		return err
	}
	configKinds := []schema.GroupVersionKind{nsv1alpha1.ProviderConfigGroupVersionKind, nsv1alpha1.ClusterProviderConfigGroupVersionKind, clusterv1alpha1.ProviderConfigGroupVersionKind}
	if err := health.Setup(mgr, health.Reconciler{
		Kube:     mgr.GetClient(),
		Configs:  configs,
		Interval: ho.Interval,
		Timeout:  ho.Timeout,
	}, o.Logger, configKinds...); err != nil {
		return err
	}
	return orphans.Setup(mgr, orphans.Sweeper{
		Kube:     mgr.GetClient(),
		Configs:  configs,
		Kinds:    kinds,
		Interval: ho.OrphanInterval,
		Timeout:  ho.Timeout,
		Log:      o.Logger,
	}, configKinds...)
}
