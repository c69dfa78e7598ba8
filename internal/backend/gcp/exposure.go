package gcp

import "github.com/egressproxy/provider-egressproxy/internal/proxy"

// Exposure is the gcp backend's proxy.Extension of a Request: how the
// instance is reached. The GCPProxy binding fills it from the resource's
// address and firewall; a Request without one is the zero Exposure.
type Exposure struct {
	// AddressType is AddressEphemeral, AddressStatic or AddressInternal.
	AddressType string
	// RetainAddress keeps a static address when the instance is deleted.
	RetainAddress bool
	// ManageFirewall creates a firewall rule admitting the allowed client
	// CIDRs to the proxy port.
	ManageFirewall bool
}

// HashInput is the Exposure in the shape of the per-kind block the
// contract carried before extensions, so that proxy.Hash of an existing
// instance's request stays what it was.
func (e Exposure) HashInput() any {
	return struct {
		AddressType    string
		RetainAddress  bool
		ManageFirewall bool
		ServiceType    string
	}{AddressType: e.AddressType, RetainAddress: e.RetainAddress, ManageFirewall: e.ManageFirewall}
}

// exposureOf returns req's Exposure, the zero one when it has none.
func exposureOf(req proxy.Request) Exposure {
	e, _ := req.Extension.(Exposure)
	return e
}
