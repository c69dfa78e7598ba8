// Package v1alpha1 holds the legacy cluster-scoped ProviderConfig and ProviderConfigUsage
// used by cluster-scoped proxies (group egressproxy.io).
// +kubebuilder:object:generate=true
// +groupName=egressproxy.io
// +versionName=v1alpha1
package v1alpha1
