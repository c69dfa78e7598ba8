package v1alpha1

import spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"

// ConfigStatus returns the status shared by every config kind.
func (p *ProviderConfig) ConfigStatus() *spec.ProviderConfigStatus { return &p.Status }

// ConfigStatus returns the status shared by every config kind.
func (p *ClusterProviderConfig) ConfigStatus() *spec.ProviderConfigStatus { return &p.Status }
