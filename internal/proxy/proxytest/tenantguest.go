package proxytest

import (
	"errors"
	"net/netip"
	"strings"
)

// TenantRefusedIP is the address GuestReportsAddress makes a guest claim:
// the kubernetes Service's, in 10.96.0.0/12, which a fixture's tenant
// guard refuses (TenantRefused).
const TenantRefusedIP = "10.96.0.1"

// TenantRefused is the range a fixture's tenant guard refuses.
var TenantRefused = netip.MustParsePrefix("10.96.0.0/12")

// ErrAddressNotGuests is what GuestReportsAddress returns for a backend
// whose addresses are not the guest's word (Compute Engine's, the
// cluster's): no guest can name one.
var ErrAddressNotGuests = errors.New("proxytest: this backend's addresses are not the guest's word")

// TenantGuestsReportedAddressIsRefused: a Running instance whose request
// says TenantGuest (a tenant wrote what its guest runs) and whose guest
// then reports the cluster's kubernetes Service as its address is not
// probed there: Get reports it unreachable, with no ProxyAddress (the
// egress check goes nowhere) and a progress saying the address the
// backend reports is refused (squid.ReportedRefusedError's words).
// A backend whose addresses are not the guest's word skips the check.
func checkTenantGuest(e *env) {
	e.need("GuestReportsAddress", e.f.GuestReportsAddress != nil)
	req := e.f.Request(nameA, uidA)
	req.TenantGuest = true
	inst := e.create(req)
	e.settle(inst.ID)
	err := e.f.GuestReportsAddress(e.ctx, inst.ID, TenantRefusedIP)
	if errors.Is(err, ErrAddressNotGuests) {
		return
	}
	if err != nil {
		e.t.Fatalf("proxytest: GuestReportsAddress(%q): %v", inst.ID, err)
	}
	ref := refTo(inst, req)
	ref.TenantGuest, ref.Live = true, true
	got := e.mustGet(ref)
	if got.ProxyReachable || got.ProxyAddress != "" || !strings.Contains(got.Progress, "the backend reports the proxy's address as "+TenantRefusedIP) {
		e.t.Errorf("Get of a tenant's guest reporting %s = reachable %v, address %q, progress %q; want unreachable, no address, a progress naming the refused address",
			TenantRefusedIP, got.ProxyReachable, got.ProxyAddress, got.Progress)
	}
}
