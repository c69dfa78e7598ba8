package v1alpha1

import (
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// GCPProxySpec is the desired state of a GCPProxy.
// +kubebuilder:validation:XValidation:rule="!has(self.forProvider.proxy.auth) || !has(self.forProvider.proxy.auth.passwordSecretRef) || !has(self.forProvider.proxy.auth.passwordSecretRef.namespace)",message="forProvider.proxy.auth.passwordSecretRef.namespace is not allowed on a namespaced resource: the Secret is read from the resource's own namespace",fieldPath=".forProvider.proxy.auth.passwordSecretRef"
type GCPProxySpec struct {
	xpv2.ManagedResourceSpec `json:",inline"`
	// ForProvider is the proxy to run.
	ForProvider spec.GCPProxyParameters `json:"forProvider"`
}

// GCPProxyStatus is the observed state of a GCPProxy.
type GCPProxyStatus struct {
	xpv2.ManagedResourceStatus `json:",inline"`
	// AtProvider is what the backend reports.
	AtProvider spec.ProxyObservation `json:"atProvider,omitempty"`
}

// A GCPProxy is a Squid egress proxy running as a Compute Engine instance.
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
type GCPProxy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   GCPProxySpec   `json:"spec"`
	Status GCPProxyStatus `json:"status,omitempty"`
}

// GCPProxyList is a list of GCPProxys.
// +kubebuilder:object:root=true
type GCPProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GCPProxy `json:"items"`
}

// Parameters returns the proxy's parameters, shared by both scopes.
func (mg *GCPProxy) Parameters() *spec.GCPProxyParameters { return &mg.Spec.ForProvider }

// Observation returns the proxy's observed state, shared by both scopes.
func (mg *GCPProxy) Observation() *spec.ProxyObservation { return &mg.Status.AtProvider }
