package kubernetes

import "github.com/egressproxy/provider-egressproxy/internal/proxy"

// Exposure is the kubernetes backend's proxy.Extension of a Request: the
// Service put in front of the proxy. The PodProxy binding fills it from
// spec.forProvider.service; a Request without one gets no Service.
type Exposure struct {
	// ServiceType is "" (no Service), ClusterIP or LoadBalancer.
	ServiceType string
	// Owner, when set, is the managed resource itself, in the cluster
	// and (when namespaced) the namespace the Deployment is in: the
	// Deployment gets an owner reference to it, so that the garbage
	// collector removes the proxy when the resource is gone for good (its
	// finalizer removed by hand). The binding sets it only where that can
	// hold.
	Owner *Owner
}

// Owner is the object a proxy's Deployment is owned by.
type Owner struct {
	APIVersion, Kind, Name string
	UID                    string
}

// HashInput is the Exposure in the shape of the per-kind block the
// contract carried before extensions, so that proxy.Hash of an existing
// proxy's request stays what it was; an Owner changes it (once), so that
// the Deployment is updated to carry it, or no longer.
func (e Exposure) HashInput() any {
	type block struct {
		AddressType    string
		RetainAddress  bool
		ManageFirewall bool
		ServiceType    string
	}
	if e.Owner == nil {
		return block{ServiceType: e.ServiceType}
	}
	return struct {
		block
		Owner Owner
	}{block{ServiceType: e.ServiceType}, *e.Owner}
}

// ownerOf is the owner req asks for, nil for none.
func ownerOf(req proxy.Request) *Owner {
	e, _ := req.Extension.(Exposure)
	return e.Owner
}

// serviceType is the Service type req asks for, "" for none.
func serviceType(req proxy.Request) string {
	e, _ := req.Extension.(Exposure)
	return e.ServiceType
}
