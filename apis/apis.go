// Package apis registers every API group of the provider.
package apis

import (
	"k8s.io/apimachinery/pkg/runtime"

	clusterproxyv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	namespacedproxyv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
)

// AddToScheme adds every group of the provider, both scopes, to s.
func AddToScheme(s *runtime.Scheme) error {
	for _, add := range []func(*runtime.Scheme) error{
		clusterv1alpha1.AddToScheme,
		clusterproxyv1alpha1.AddToScheme,
		namespacedv1alpha1.AddToScheme,
		namespacedproxyv1alpha1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return err
		}
	}
	return nil
}
