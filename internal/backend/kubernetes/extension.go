package kubernetes

import "github.com/egressproxy/provider-egressproxy/internal/proxy"

// Exposure is the kubernetes backend's proxy.Extension of a Request: the
// Service put in front of the proxy. The PodProxy binding fills it from
// spec.forProvider.service; a Request without one gets no Service.
type Exposure struct {
	// ServiceType is "" (no Service), ClusterIP or LoadBalancer.
	ServiceType string
}

// HashInput is the Exposure in the shape of the per-kind block the
// contract carried before extensions, so that proxy.Hash of an existing
// proxy's request stays what it was.
func (e Exposure) HashInput() any {
	return struct {
		AddressType    string
		RetainAddress  bool
		ManageFirewall bool
		ServiceType    string
	}{ServiceType: e.ServiceType}
}

// serviceType is the Service type req asks for, "" for none.
func serviceType(req proxy.Request) string {
	e, _ := req.Extension.(Exposure)
	return e.ServiceType
}
