package gcp_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// TestConformance runs the proxy.Driver conformance suite on the real
// driver and its real client against the fake Compute Engine.
func TestConformance(t *testing.T) {
	proxytest.Run(t, proxytest.Harness{Complete: true, New: func(t *testing.T) proxytest.Fixture {
		f := newFixture(t)
		return proxytest.Fixture{
			Driver:   f.driver,
			Provider: testProvider,
			Request:  request,
			Settle: func(_ context.Context, id string) error {
				f.srv.Settle(id)
				return nil
			},
			Foreign: func(_ context.Context, name string) error {
				f.srv.PutInstance(testZone, name, nil)
				return nil
			},
			ForeignMarked: func(_ context.Context, name, uid string) error {
				f.srv.PutInstance(testZone, name, map[string]string{"egressproxy-uid": uid, "egressproxy-installation": testInstallation})
				return nil
			},
			SetUnknownState: func(_ context.Context, id string) error { return f.srv.SetStatus(id, "HIBERNATING_SIDEWAYS") },
			SetBusy:         func(_ context.Context, busy bool) { f.srv.SetBusy(busy) },
			HoldDelete:      func(_ context.Context, id string) func() { return f.srv.HoldDelete(id) },
			PartialCreate: func(ctx context.Context, name, uid string) error {
				// The rule and the address are made; the instance's insert
				// is refused for quota.
				req := request(name, uid)
				req.Extension = gcp.Exposure{AddressType: gcp.AddressStatic, ManageFirewall: true}
				f.srv.FailNext("POST", "/instances", http.StatusForbidden, "quotaExceeded", "Quota 'CPUS' exceeded.")
				for range 5 {
					if _, err := f.driver.Create(ctx, req); err != nil {
						return nil
					}
					f.srv.SettleAll()
				}
				return fmt.Errorf("the create of %s was not cut short", name)
			},
			Leftovers: func(_ context.Context, name string) ([]string, error) {
				var out []string
				for _, n := range f.srv.Names() {
					if strings.HasSuffix(n, "/"+name) || n == "firewall "+name {
						out = append(out, n)
					}
				}
				return out, nil
			},
			ReportEgress: func(_ context.Context, id, line string) error {
				// A firewall admitting only the clients; the guest's line
				// in its guest attribute.
				f.srv.EnforceFirewall("127.0.0.1")
				f.srv.SetGuestAttribute(strings.TrimPrefix(strings.Replace(id, "/instances/", "/", 1), "zones/"), cloudinit.GuestAttributeKey, strings.TrimRight(line, "\n"))
				return nil
			},
			// The addresses are Compute Engine's, not the guest's.
			GuestReportsAddress: func(context.Context, string, string) error { return proxytest.ErrAddressNotGuests },
			LogOutput:           f.logs.String,
			MalformedIDs: []string{
				"pt-alpha",                              // a name, not an ID
				"zones/europe-west1-b/instances/",       // no name
				"zones/Europe_West/instances/pt-alpha",  // not a zone
				"zones/europe-west1-b/disks/pt-alpha",   // another resource
				"zones/europe-west1-b/instances/A_name", // not a name
				"memory/pt-alpha",                       // another backend's ID
			},
		}
	}})
}
