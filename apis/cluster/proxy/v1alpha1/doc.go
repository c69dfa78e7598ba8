// Package v1alpha1 holds the cluster-scoped (legacy, for claims) proxy managed resources of
// group proxy.egressproxy.io.
// +kubebuilder:object:generate=true
// +groupName=proxy.egressproxy.io
// +versionName=v1alpha1
package v1alpha1
