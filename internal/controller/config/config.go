// Package config sets up the ProviderConfig controllers: usage accounting
// (a config in use is not deleted) for all three config kinds.
package config

import (
	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/providerconfig"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
)

// Setup registers usage accounting for every config kind. rm is the
// manager the reconcilers take their client from (a config whose finalizer
// is in place needs no update each time a usage comes or goes).
func Setup(mgr, rm ctrl.Manager, o controller.Options) error {
	for _, c := range []struct {
		config, usage client.Object
		kinds         resource.ProviderConfigKinds
		kind          string
	}{
		{&nsv1alpha1.ProviderConfig{}, &nsv1alpha1.ProviderConfigUsage{}, resource.ProviderConfigKinds{
			Config: nsv1alpha1.ProviderConfigGroupVersionKind, Usage: nsv1alpha1.ProviderConfigUsageGroupVersionKind,
			UsageList: nsv1alpha1.SchemeGroupVersion.WithKind(nsv1alpha1.ProviderConfigUsageListKind),
		}, nsv1alpha1.ProviderConfigKind},
		{&nsv1alpha1.ClusterProviderConfig{}, &nsv1alpha1.ProviderConfigUsage{}, resource.ProviderConfigKinds{
			Config: nsv1alpha1.ClusterProviderConfigGroupVersionKind, Usage: nsv1alpha1.ProviderConfigUsageGroupVersionKind,
			UsageList: nsv1alpha1.SchemeGroupVersion.WithKind(nsv1alpha1.ProviderConfigUsageListKind),
		}, nsv1alpha1.ClusterProviderConfigKind},
		{&clusterv1alpha1.ProviderConfig{}, &clusterv1alpha1.ProviderConfigUsage{}, resource.ProviderConfigKinds{
			Config: clusterv1alpha1.ProviderConfigGroupVersionKind, Usage: clusterv1alpha1.ProviderConfigUsageGroupVersionKind,
			UsageList: clusterv1alpha1.SchemeGroupVersion.WithKind(clusterv1alpha1.ProviderConfigUsageListKind),
		}, ""},
	} {
		name := providerconfig.ControllerName(c.kinds.Config.GroupKind().String())
		r := providerconfig.NewReconciler(rm, c.kinds,
			providerconfig.WithLogger(o.Logger.WithValues("controller", name)),
			providerconfig.WithRecorder(event.NewAPIRecorder(mgr.GetEventRecorderFor(name))))
		if err := ctrl.NewControllerManagedBy(mgr).
			Named(name).
			WithOptions(o.ForControllerRuntime()).
			For(c.config).
			Watches(c.usage, &resource.EnqueueRequestForProviderConfig{Kind: c.kind}).
			Complete(ratelimiter.NewReconciler(name, r, o.GlobalRateLimiter)); err != nil {
			return err
		}
	}
	return nil
}
