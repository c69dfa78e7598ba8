package kvm

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// TestConformance runs the contract's suite on the driver over the fake
// host. The image is not cached, so every instance goes through the
// background download and the background finish.
func TestConformance(t *testing.T) {
	proxytest.Run(t, proxytest.Harness{Complete: true, New: func(t *testing.T) proxytest.Fixture {
		e := newTestEnv(t, func(e *testEnv) {
			// The tenant guard (the controller's TenantGuard).
			e.cfg.URLGuard = netguard.New(netguard.Options{Denied: []netip.Prefix{proxytest.TenantRefused}})
		})
		return proxytest.Fixture{
			Driver:   e.d,
			Provider: testProvider,
			Request:  e.request,
			Settle:   e.settle,
			Foreign: func(ctx context.Context, name string) error {
				_, err := e.host.conn().DomainDefineXML(ctx, "<domain type='kvm'><name>"+name+"</name></domain>")
				return err
			},
			ForeignMarked: func(ctx context.Context, name, uid string) error {
				m := instanceMeta{Managed: true, UID: uid, InstallationID: testInstallation, CreatedAt: "2026-01-02T03:04:05Z"}
				_, err := e.host.conn().DomainDefineXML(ctx, "<domain type='kvm'><name>"+name+"</name><metadata>"+m.element(true)+"</metadata></domain>")
				return err
			},
			SetUnknownState: func(_ context.Context, id string) error {
				_, name, _ := parseID(id)
				e.host.mu.Lock()
				defer e.host.mu.Unlock()
				e.host.domains[name].state = libvirt.DomainState(42)
				return nil
			},
			SetBusy: func(_ context.Context, busy bool) {
				e.host.mu.Lock()
				e.host.busy = busy
				e.host.mu.Unlock()
			},
			HoldDelete: func(_ context.Context, id string) func() {
				// Mid-teardown: libvirt reports the domain shutting down.
				_, name, _ := parseID(id)
				e.host.mu.Lock()
				if d := e.host.domains[name]; d != nil {
					d.state = libvirt.DomainShutdown
				}
				e.host.mu.Unlock()
				return func() {}
			},
			PartialCreate: func(ctx context.Context, name, uid string) error {
				// The domain's definition fails (in the background, once the
				// image is in): the overlay and the seed are left.
				e.host.mu.Lock()
				e.host.failNext["DomainDefineXML"] = []error{lverr(libvirt.ErrInternalError, "internal error: the provider stopped here")}
				e.host.mu.Unlock()
				req := e.request(name, uid)
				if _, err := e.d.Create(ctx, req); err != nil {
					return err
				}
				e.waitBackgroundDone()
				// The failure is reported once, to the next Get; then forgotten.
				if _, err := e.d.Get(ctx, proxy.Ref{Name: name, Mark: req.Mark, Placement: req.Placement}); err == nil {
					return fmt.Errorf("the create of %s was not cut short", name)
				}
				return nil
			},
			Leftovers: func(_ context.Context, name string) ([]string, error) {
				var out []string
				for _, v := range e.host.volNames() {
					if v == overlayName(name) || v == seedName(name) {
						out = append(out, v)
					}
				}
				return out, nil
			},
			ReportEgress: func(_ context.Context, id, line string) error {
				// Squid answers no probe; the guest's line in its file.
				e.host.mu.Lock()
				defer e.host.mu.Unlock()
				e.host.squid = map[string]string{}
				e.host.guestFiles[cloudinit.ReportPath] = base64.StdEncoding.EncodeToString([]byte(line))
				return nil
			},
			GuestReportsAddress: func(_ context.Context, id, ip string) error {
				_, name, err := parseID(id)
				if err != nil {
					return err
				}
				e.host.mu.Lock()
				defer e.host.mu.Unlock()
				d := e.host.domains[name]
				if d == nil {
					return fmt.Errorf("no domain %q", name)
				}
				// The guest agent's answer, and its Squid there too: only
				// the guard keeps the probe from it.
				for addr, identity := range e.host.squid {
					if host, port, _ := net.SplitHostPort(addr); host == d.agentIP {
						e.host.squid[net.JoinHostPort(ip, port)] = identity
					}
				}
				d.agentIP = ip
				return nil
			},
			LogOutput:    e.logs.String,
			Secrets:      []string{sentinelKey, sentinelKnownHosts, "S3NT1NEL-key-material-9f8e7d6c5b4a", "S3NT1NEL-known-hosts-1a2b3c4d5e6f"},
			MalformedIDs: []string{"pt-alpha", "hosts/lab/domains/", "hosts/lab/vms/pt-alpha", "hosts/lab/domains/pt-alpha/x", "memory/pt-alpha", "hosts//domains/pt-alpha"},
		}
	}})
}
