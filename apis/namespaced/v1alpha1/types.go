package v1alpha1

import (
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// NamespacedProviderConfigSpec is a ProviderConfigSpec whose Secret refs
// name Secrets in the config's own namespace, and which never uses the
// provider's own identity (InjectedIdentity): a namespace user can act with
// no more than their namespace gives them.
// +kubebuilder:validation:XValidation:rule="!has(self.gcp) || self.gcp.credentials.source != 'InjectedIdentity'",message="gcp.credentials.source InjectedIdentity is not allowed on a namespaced ProviderConfig: it would act with the provider's own Google identity; use source Secret with a service-account key in this namespace, or a ClusterProviderConfig the platform team provides",fieldPath=".gcp.credentials.source"
// +kubebuilder:validation:XValidation:rule="!has(self.gcp) || !has(self.gcp.endpoint)",message="gcp.endpoint is not allowed on a namespaced ProviderConfig: the provider would send this config's tokens to it and report its answers from inside the cluster; a ClusterProviderConfig the platform team provides can set it",fieldPath=".gcp.endpoint"
// +kubebuilder:validation:XValidation:rule="!has(self.kubernetes) || self.kubernetes.credentials.source != 'InjectedIdentity'",message="kubernetes.credentials.source InjectedIdentity is not allowed on a namespaced ProviderConfig: it would act with the provider's own service account; use source Secret with a kubeconfig in this namespace, or a ClusterProviderConfig the platform team provides",fieldPath=".kubernetes.credentials.source"
// +kubebuilder:validation:XValidation:rule="!has(self.kvm) || !has(self.kvm.credentials.sshKeySecretRef.namespace)",message="kvm.credentials.sshKeySecretRef.namespace is not allowed on a namespaced ProviderConfig: Secrets are read from the config's own namespace",fieldPath=".kvm.credentials.sshKeySecretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.kvm) || !has(self.kvm.credentials.knownHostsSecretRef) || !has(self.kvm.credentials.knownHostsSecretRef.namespace)",message="kvm.credentials.knownHostsSecretRef.namespace is not allowed on a namespaced ProviderConfig: Secrets are read from the config's own namespace",fieldPath=".kvm.credentials.knownHostsSecretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.proxmox) || !has(self.proxmox.credentials.tokenSecretRef.namespace)",message="proxmox.credentials.tokenSecretRef.namespace is not allowed on a namespaced ProviderConfig: Secrets are read from the config's own namespace",fieldPath=".proxmox.credentials.tokenSecretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.proxmox) || !has(self.proxmox.credentials.caSecretRef) || !has(self.proxmox.credentials.caSecretRef.namespace)",message="proxmox.credentials.caSecretRef.namespace is not allowed on a namespaced ProviderConfig: Secrets are read from the config's own namespace",fieldPath=".proxmox.credentials.caSecretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.gcp) || !has(self.gcp.credentials.secretRef) || !has(self.gcp.credentials.secretRef.namespace)",message="gcp.credentials.secretRef.namespace is not allowed on a namespaced ProviderConfig: Secrets are read from the config's own namespace",fieldPath=".gcp.credentials.secretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.kubernetes) || !has(self.kubernetes.credentials.secretRef) || !has(self.kubernetes.credentials.secretRef.namespace)",message="kubernetes.credentials.secretRef.namespace is not allowed on a namespaced ProviderConfig: Secrets are read from the config's own namespace",fieldPath=".kubernetes.credentials.secretRef.namespace"
type NamespacedProviderConfigSpec struct {
	spec.ProviderConfigSpec `json:",inline"`
}

// ClusterProviderConfigSpec is a ProviderConfigSpec whose Secret refs name
// their namespace.
// +kubebuilder:validation:XValidation:rule="!has(self.kvm) || has(self.kvm.credentials.sshKeySecretRef.namespace)",message="kvm.credentials.sshKeySecretRef.namespace is required on a cluster-scoped config",fieldPath=".kvm.credentials.sshKeySecretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.kvm) || !has(self.kvm.credentials.knownHostsSecretRef) || has(self.kvm.credentials.knownHostsSecretRef.namespace)",message="kvm.credentials.knownHostsSecretRef.namespace is required on a cluster-scoped config",fieldPath=".kvm.credentials.knownHostsSecretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.proxmox) || has(self.proxmox.credentials.tokenSecretRef.namespace)",message="proxmox.credentials.tokenSecretRef.namespace is required on a cluster-scoped config",fieldPath=".proxmox.credentials.tokenSecretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.proxmox) || !has(self.proxmox.credentials.caSecretRef) || has(self.proxmox.credentials.caSecretRef.namespace)",message="proxmox.credentials.caSecretRef.namespace is required on a cluster-scoped config",fieldPath=".proxmox.credentials.caSecretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.gcp) || !has(self.gcp.credentials.secretRef) || has(self.gcp.credentials.secretRef.namespace)",message="gcp.credentials.secretRef.namespace is required on a cluster-scoped config",fieldPath=".gcp.credentials.secretRef.namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.kubernetes) || !has(self.kubernetes.credentials.secretRef) || has(self.kubernetes.credentials.secretRef.namespace)",message="kubernetes.credentials.secretRef.namespace is required on a cluster-scoped config",fieldPath=".kubernetes.credentials.secretRef.namespace"
type ClusterProviderConfigSpec struct {
	spec.ProviderConfigSpec `json:",inline"`
}

// A ProviderConfig says where the proxies of its namespace run and with which
// credentials (Secrets in the same namespace).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="BACKEND",type="string",JSONPath=".status.backend"
// +kubebuilder:printcolumn:name="HEALTHY",type="string",JSONPath=".status.conditions[?(@.type=='Healthy')].status"
// +kubebuilder:printcolumn:name="USERS",type="integer",JSONPath=".status.users"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,categories={crossplane,provider,egress}
type ProviderConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NamespacedProviderConfigSpec `json:"spec"`
	Status spec.ProviderConfigStatus    `json:"status,omitempty"`
}

// ProviderConfigList is a list of ProviderConfigs.
// +kubebuilder:object:root=true
type ProviderConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProviderConfig `json:"items"`
}

// A ClusterProviderConfig says where proxies of any namespace run and with
// which credentials.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="BACKEND",type="string",JSONPath=".status.backend"
// +kubebuilder:printcolumn:name="HEALTHY",type="string",JSONPath=".status.conditions[?(@.type=='Healthy')].status"
// +kubebuilder:printcolumn:name="USERS",type="integer",JSONPath=".status.users"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Cluster,categories={crossplane,provider,egress}
type ClusterProviderConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterProviderConfigSpec `json:"spec"`
	Status spec.ProviderConfigStatus `json:"status,omitempty"`
}

// ClusterProviderConfigList is a list of ClusterProviderConfigs.
// +kubebuilder:object:root=true
type ClusterProviderConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterProviderConfig `json:"items"`
}

// A ProviderConfigUsage records that a namespaced proxy uses a ProviderConfig
// or ClusterProviderConfig, so a config in use is not deleted.
// +kubebuilder:object:root=true
// +kubebuilder:printcolumn:name="CONFIG-NAME",type="string",JSONPath=".providerConfigRef.name"
// +kubebuilder:printcolumn:name="RESOURCE-KIND",type="string",JSONPath=".resourceRef.kind"
// +kubebuilder:printcolumn:name="RESOURCE-NAME",type="string",JSONPath=".resourceRef.name"
// +kubebuilder:printcolumn:name="AGE",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:resource:scope=Namespaced,categories={crossplane,provider,egress}
type ProviderConfigUsage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	xpv2.TypedProviderConfigUsage `json:",inline"`
}

// ProviderConfigUsageList is a list of ProviderConfigUsages.
// +kubebuilder:object:root=true
type ProviderConfigUsageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProviderConfigUsage `json:"items"`
}
