package proxmox_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// TestConformance runs the contract's suite on the driver over the fake
// cluster, every task held until Settle (which ends them and lets the
// driver take its next steps, as reconciles would).
func TestConformance(t *testing.T) {
	proxytest.Run(t, proxytest.Harness{Complete: true, New: func(t *testing.T) proxytest.Fixture {
		f := newFixture(t, withConfig(func(c *proxmox.Config) {
			// The tenant guard (the controller's TenantGuard); the fake's
			// guests are on loopback.
			c.TenantGuard = netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Denied: []netip.Prefix{proxytest.TenantRefused}})
		}))
		token := f.fake.Token()
		return proxytest.Fixture{
			Driver:   f.rec,
			Provider: testProvider,
			Request:  f.request,
			Settle:   f.settle,
			Foreign: func(_ context.Context, name string) error {
				f.fake.AddVM(pvetest.VMSpec{Name: name, Running: true})
				return nil
			},
			ForeignMarked: func(_ context.Context, name, uid string) error {
				mark := proxy.Mark{UID: uid, InstallationID: testInstallation}
				f.fake.AddVM(pvetest.VMSpec{Name: name, Running: true, Tags: proxmox.MarkTags(mark, "0123456789abcdef"),
					Description: proxmox.MarkDescription(name, mark, time.Now())})
				return nil
			},
			SetUnknownState: func(_ context.Context, id string) error {
				return f.fake.SetQMPStatus(vmidOf(t, id), "internal-error")
			},
			SetBusy: func(_ context.Context, busy bool) { f.fake.SetBusy(busy) },
			HoldDelete: func(_ context.Context, id string) func() {
				return f.fake.HoldDestroy(vmidOf(t, id))
			},
			PartialCreate: func(ctx context.Context, name, uid string) error {
				// The VM goes (by hand, or its config lost) once its seed
				// is uploaded: the seed ISO is left, without a VM.
				r := &reconciler{t: t, f: f, drv: f.drv, req: f.request(name, uid)}
				for range 10 {
					if _, err := r.reconcile(ctx); err != nil {
						return err
					}
					f.fake.FinishTasks()
					if len(f.fake.Volumes()) > 0 {
						f.fake.Remove(vmidOf(t, r.status.ID))
						return nil
					}
				}
				return fmt.Errorf("no seed was uploaded for %s", name)
			},
			Leftovers: func(_ context.Context, name string) ([]string, error) {
				var out []string
				for _, v := range f.fake.Volumes() {
					if strings.Contains(v.VolID, name) {
						out = append(out, v.VolID)
					}
				}
				return out, nil
			},
			ReportEgress: func(_ context.Context, id, line string) error {
				vmid, _, ok := splitID(id)
				if !ok {
					return fmt.Errorf("%q is not an ID", id)
				}
				f.fake.BlockProbes(true)
				f.fake.SetGuestFile(vmid, cloudinit.ReportPath, line)
				return nil
			},
			GuestReportsAddress: func(_ context.Context, id, ip string) error {
				f.fake.SetGuestAddress(vmidOf(t, id), ip)
				return nil
			},
			LogOutput: f.logs.String,
			Secrets:   []string{token, token[len("egress@pve!provider="):]},
			MalformedIDs: []string{
				"pt-alpha",               // a name, not an ID
				"vms/",                   // nothing
				"vms/abc/pt-alpha",       // VMID not a number
				"vms/99/pt-alpha",        // below the lowest VMID
				"vms/0100/pt-alpha",      // leading zero
				"vms/100/Not_A_Name",     // not a name
				"vms/100/pt-alpha/extra", // too many parts
				"memory/pt-alpha",        // another backend's ID
			},
		}
	}})
}
