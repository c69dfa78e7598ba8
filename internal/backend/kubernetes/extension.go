package kubernetes

import "github.com/egressproxy/provider-egressproxy/internal/proxy"

// MaxReplicas is the most pods a proxy may have (admission says the same).
const MaxReplicas = 10

// Exposure is the kubernetes backend's proxy.Extension of a Request: the
// Service put in front of the proxy and the number of its pods. The
// PodProxy binding fills it from spec.forProvider.service and replicas; a
// Request without one gets no Service and one pod.
type Exposure struct {
	// ServiceType is "" (no Service), ClusterIP or LoadBalancer.
	ServiceType string
	// Replicas is the number of pods; 0 means 1.
	Replicas int32
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
		// Absent for one replica, as before there were more.
		Replicas int32 `json:",omitempty"`
	}{ServiceType: e.ServiceType, Replicas: hashedReplicas(e)}
}

// serviceType is the Service type req asks for, "" for none.
func serviceType(req proxy.Request) string {
	e, _ := req.Extension.(Exposure)
	return e.ServiceType
}

// replicas is the number of pods req asks for: 1 at least.
func replicas(req proxy.Request) int32 {
	e, _ := req.Extension.(Exposure)
	return max(hashedReplicas(e), 1)
}

// hashedReplicas is e's replicas for the hash: 0 for one.
func hashedReplicas(e Exposure) int32 {
	if e.Replicas <= 1 {
		return 0
	}
	return e.Replicas
}
