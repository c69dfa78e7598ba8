// Package v1alpha1 holds the ProviderConfig, ClusterProviderConfig and ProviderConfigUsage
// used by namespaced proxies (group m.egressproxy.io).
// +kubebuilder:object:generate=true
// +groupName=m.egressproxy.io
// +versionName=v1alpha1
package v1alpha1
