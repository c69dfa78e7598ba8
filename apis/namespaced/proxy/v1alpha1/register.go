package v1alpha1

import (
	"reflect"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// Package type metadata.
const (
	Group   = "proxy.m.egressproxy.io"
	Version = "v1alpha1"
)

var (
	// SchemeGroupVersion is group version used to register these objects.
	SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

	// SchemeBuilder is used to add go types to the GroupVersionKind scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: SchemeGroupVersion}

	// AddToScheme adds the types of this group to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// KVMProxy type metadata.
var (
	KVMProxyKind             = reflect.TypeOf(KVMProxy{}).Name()
	KVMProxyGroupKind        = schema.GroupKind{Group: Group, Kind: KVMProxyKind}.String()
	KVMProxyKindAPIVersion   = KVMProxyKind + "." + SchemeGroupVersion.String()
	KVMProxyGroupVersionKind = SchemeGroupVersion.WithKind(KVMProxyKind)
)

// ProxmoxProxy type metadata.
var (
	ProxmoxProxyKind             = reflect.TypeOf(ProxmoxProxy{}).Name()
	ProxmoxProxyGroupKind        = schema.GroupKind{Group: Group, Kind: ProxmoxProxyKind}.String()
	ProxmoxProxyKindAPIVersion   = ProxmoxProxyKind + "." + SchemeGroupVersion.String()
	ProxmoxProxyGroupVersionKind = SchemeGroupVersion.WithKind(ProxmoxProxyKind)
)

// GCPProxy type metadata.
var (
	GCPProxyKind             = reflect.TypeOf(GCPProxy{}).Name()
	GCPProxyGroupKind        = schema.GroupKind{Group: Group, Kind: GCPProxyKind}.String()
	GCPProxyKindAPIVersion   = GCPProxyKind + "." + SchemeGroupVersion.String()
	GCPProxyGroupVersionKind = SchemeGroupVersion.WithKind(GCPProxyKind)
)

// PodProxy type metadata.
var (
	PodProxyKind             = reflect.TypeOf(PodProxy{}).Name()
	PodProxyGroupKind        = schema.GroupKind{Group: Group, Kind: PodProxyKind}.String()
	PodProxyKindAPIVersion   = PodProxyKind + "." + SchemeGroupVersion.String()
	PodProxyGroupVersionKind = SchemeGroupVersion.WithKind(PodProxyKind)
)

func init() {
	SchemeBuilder.Register(&KVMProxy{}, &KVMProxyList{})
	SchemeBuilder.Register(&ProxmoxProxy{}, &ProxmoxProxyList{})
	SchemeBuilder.Register(&GCPProxy{}, &GCPProxyList{})
	SchemeBuilder.Register(&PodProxy{}, &PodProxyList{})
}
