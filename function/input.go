package function

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// InputGroupVersion is the apiVersion of the function's input.
var InputGroupVersion = schema.GroupVersion{Group: "function.egressproxy.io", Version: "v1alpha1"}

// InputKind is the kind of the function's input.
const InputKind = "ProxyClasses"

// ProxyClasses is the function's input: the platform team's mapping from
// the classes application teams ask for to backends. It is written in the
// Composition's pipeline step and has no CRD: Crossplane passes it to the
// function as it is.
//
//	apiVersion: function.egressproxy.io/v1alpha1
//	kind: ProxyClasses
//	defaultClass: standard
//	classes:
//	  standard:
//	    kind: PodProxy
//	    providerConfigRef: {kind: ClusterProviderConfig, name: pods}
//	    sizes:
//	      small: {}
//	      large: {providerConfigRef: {kind: ClusterProviderConfig, name: pods-large}}
//	  dedicated:
//	    kind: KVMProxy
//	    providerConfigRef: {kind: ClusterProviderConfig, name: home-kvm}
//	    parameters: {image: debian-13}
//	    sizes:
//	      small: {parameters: {machineType: small}}
type ProxyClasses struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// DefaultClass is the class of a request that names none.
	DefaultClass string `json:"defaultClass,omitempty"`

	// Classes by the name application teams use.
	Classes map[string]Class `json:"classes"`

	// ConnectionSecretNamespace is where the managed resources of
	// cluster-scoped (legacy) composite resources write their connection
	// Secrets, when the composite names no namespace of its own (the
	// Composition's writeConnectionSecretsToNamespace). Default:
	// crossplane-system.
	ConnectionSecretNamespace string `json:"connectionSecretNamespace,omitempty"`
}

// Class is one backend offering: which managed resource kind, which
// ProviderConfig, and the platform's defaults.
type Class struct {
	// Kind of the managed resource: KVMProxy, ProxmoxProxy, GCPProxy or
	// PodProxy. Its API group follows the composite's scope:
	// proxy.m.egressproxy.io for namespaced composites,
	// proxy.egressproxy.io for cluster-scoped (legacy) ones.
	Kind string `json:"kind"`

	// ProviderConfigRef of the managed resource. Kind is ignored for
	// cluster-scoped managed resources, whose ProviderConfig is always the
	// legacy cluster-scoped one.
	ProviderConfigRef ProviderConfigRef `json:"providerConfigRef"`

	// Parameters are the managed resource's spec.forProvider defaults, in
	// the backend's own words (host, node, zone, image, machineType,
	// service, address, firewall, proxy.port, proxy.allowedPorts, ...).
	// What the request says about the proxy block wins.
	Parameters map[string]any `json:"parameters,omitempty"`

	// DefaultSize is the size of a request that names none. Default:
	// small.
	DefaultSize string `json:"defaultSize,omitempty"`

	// Sizes offered by this class. A request for a size not listed is
	// refused with the list of those that are.
	Sizes map[string]Size `json:"sizes"`
}

// Size is what a size means on a class's backend.
type Size struct {
	// Parameters are merged over the class's (typically machineType).
	Parameters map[string]any `json:"parameters,omitempty"`

	// ProviderConfigRef replaces the class's: for PodProxy, whose pod
	// resources come from its ProviderConfig, a size is a ProviderConfig.
	ProviderConfigRef *ProviderConfigRef `json:"providerConfigRef,omitempty"`
}

// ProviderConfigRef names a ProviderConfig.
type ProviderConfigRef struct {
	// Kind is ClusterProviderConfig or ProviderConfig (namespaced managed
	// resources only). Default: ClusterProviderConfig.
	Kind string `json:"kind,omitempty"`
	// Name of the ProviderConfig.
	Name string `json:"name"`
}

// DeepCopyObject makes ProxyClasses a runtime.Object, as the SDK's
// request.GetInput wants. The input is small and read once per call, so a
// JSON round trip is fine.
func (in *ProxyClasses) DeepCopyObject() runtime.Object {
	out := &ProxyClasses{}
	b, err := json.Marshal(in)
	if err != nil {
		panic(err) // only maps, strings and numbers: cannot happen.
	}
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}
