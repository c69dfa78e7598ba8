package v1alpha1

import (
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// ProxmoxProxySpec is the desired state of a ProxmoxProxy.
// +kubebuilder:validation:XValidation:rule="!has(self.forProvider.proxy.auth) || !has(self.forProvider.proxy.auth.passwordSecretRef) || !has(self.forProvider.proxy.auth.passwordSecretRef.namespace)",message="forProvider.proxy.auth.passwordSecretRef.namespace is not allowed on a namespaced resource: the Secret is read from the resource's own namespace",fieldPath=".forProvider.proxy.auth.passwordSecretRef"
type ProxmoxProxySpec struct {
	xpv2.ManagedResourceSpec `json:",inline"`
	// ForProvider is the proxy to run.
	ForProvider spec.ProxmoxProxyParameters `json:"forProvider"`
}

// ProxmoxProxyStatus is the observed state of a ProxmoxProxy.
type ProxmoxProxyStatus struct {
	xpv2.ManagedResourceStatus `json:",inline"`
	// AtProvider is what the backend reports.
	AtProvider spec.ProxyObservation `json:"atProvider,omitempty"`
}

// A ProxmoxProxy is a Squid egress proxy running as a VM cloned from a template on Proxmox VE.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="READY",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status"
// +kubebuilder:printcolumn:name="SYNCED",type="string",JSONPath=".status.conditions[?(@.type=='Synced')].status"
// +kubebuilder:printcolumn:name="EXTERNAL-NAME",type="string",JSONPath=".metadata.annotations.crossplane\\.io/external-name"
// +kubebuilder:printcolumn:name="IP",type="string",JSONPath=".status.atProvider.ip"
// +kubebuilder:printcolumn:name="STATE",type="string",JSONPath=".status.atProvider.state"
// +kubebuilder:printcolumn:name="EGRESS-IP",type="string",JSONPath=".status.atProvider.egressIP"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="CONFIG",type="string",JSONPath=".spec.providerConfigRef.name",priority=1
// +kubebuilder:printcolumn:name="BACKEND-ID",type="string",JSONPath=".status.atProvider.id",priority=1
// +kubebuilder:resource:scope=Namespaced,categories={crossplane,managed,egress}
type ProxmoxProxy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProxmoxProxySpec   `json:"spec"`
	Status ProxmoxProxyStatus `json:"status,omitempty"`
}

// ProxmoxProxyList is a list of ProxmoxProxys.
// +kubebuilder:object:root=true
type ProxmoxProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxmoxProxy `json:"items"`
}

// Parameters returns the proxy's parameters, shared by both scopes.
func (mg *ProxmoxProxy) Parameters() *spec.ProxmoxProxyParameters { return &mg.Spec.ForProvider }

// Observation returns the proxy's observed state, shared by both scopes.
func (mg *ProxmoxProxy) Observation() *spec.ProxyObservation { return &mg.Status.AtProvider }
