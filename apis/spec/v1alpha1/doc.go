// Package v1alpha1 holds the types both API scopes share: the parameters of
// every proxy kind, the common proxy block, the observation, and the
// ProviderConfig's backend blocks. The namespaced (m.egressproxy.io) and
// cluster (egressproxy.io) groups embed them, so a field is spelled once.
// +kubebuilder:object:generate=true
package v1alpha1
