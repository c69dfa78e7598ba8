package apis

import (
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"

	clusterproxyv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	namespacedproxyv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
)

// Compile-time proof that every kind satisfies crossplane-runtime's
// interfaces for its scope.
var (
	_ resource.ModernManaged = &namespacedproxyv1alpha1.KVMProxy{}
	_ resource.ModernManaged = &namespacedproxyv1alpha1.ProxmoxProxy{}
	_ resource.ModernManaged = &namespacedproxyv1alpha1.GCPProxy{}
	_ resource.ModernManaged = &namespacedproxyv1alpha1.PodProxy{}
	_ resource.ManagedList   = &namespacedproxyv1alpha1.PodProxyList{}

	_ resource.LegacyManaged = &clusterproxyv1alpha1.KVMProxy{}
	_ resource.LegacyManaged = &clusterproxyv1alpha1.ProxmoxProxy{}
	_ resource.LegacyManaged = &clusterproxyv1alpha1.GCPProxy{}
	_ resource.LegacyManaged = &clusterproxyv1alpha1.PodProxy{}
	_ resource.ManagedList   = &clusterproxyv1alpha1.PodProxyList{}

	_ resource.ProviderConfig           = &namespacedv1alpha1.ProviderConfig{}
	_ resource.ProviderConfig           = &namespacedv1alpha1.ClusterProviderConfig{}
	_ resource.TypedProviderConfigUsage = &namespacedv1alpha1.ProviderConfigUsage{}
	_ resource.ProviderConfigUsageList  = &namespacedv1alpha1.ProviderConfigUsageList{}

	_ resource.ProviderConfig            = &clusterv1alpha1.ProviderConfig{}
	_ resource.LegacyProviderConfigUsage = &clusterv1alpha1.ProviderConfigUsage{}
	_ resource.ProviderConfigUsageList   = &clusterv1alpha1.ProviderConfigUsageList{}
)
