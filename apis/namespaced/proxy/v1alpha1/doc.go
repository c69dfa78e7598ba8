// Package v1alpha1 holds the namespaced proxy managed resources of
// group proxy.m.egressproxy.io.
// +kubebuilder:object:generate=true
// +groupName=proxy.m.egressproxy.io
// +versionName=v1alpha1
package v1alpha1
