package kvm

import (
	"context"
	"encoding/base64"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid/squidtest"
)

// TestGuestsDenyTheirHypervisor: a guest's Squid denies the addresses of
// the host it runs on (its sshd, libvirtd), on create and on update,
// whatever ports the proxy allows and also where the proxy opens the
// host's private range; a host named by name is denied at the addresses
// the name resolves to.
func TestGuestsDenyTheirHypervisor(t *testing.T) {
	for name, tc := range map[string]struct {
		address, want string
		opened        []string
	}{
		"PublicAddress":       {address: "203.0.113.10:22", want: "203.0.113.10"},
		"PrivateRangeOpened":  {address: "10.20.0.2:22", want: "10.20.0.2", opened: []string{"10.20.0.0/24"}},
		"IPv6":                {address: "[2001:db8::5]:22", want: "2001:db8::5"},
		"Name":                {address: "fakehost:22", want: "192.0.2.10"},
		"NameOfAPrivateRange": {address: "lab.internal:2222", want: "10.20.0.3", opened: []string{"10.20.0.0/16"}},
	} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t, func(e *testEnv) {
				e.cfg.Hosts[0].Address = tc.address
				e.resolver["lab.internal"] = []netip.Addr{netip.MustParseAddr("10.20.0.3")}
			})
			want := netip.MustParseAddr(tc.want)
			req := e.request("web", "uid-1")
			req.Proxy.AllowedPorts = []int32{443, 22, 16509}
			req.Proxy.AllowedDestinationCIDRs = tc.opened
			p, err := e.d.plan(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if conf := cloudinit.SquidConfOf(p.userData); !squidtest.NeverDenies(conf, want) {
				t.Errorf("the seed's squid.conf does not deny the host at %s:\n%s", want, conf)
			}

			inst := createAndBootReq(t, e, req)
			req.Proxy.AllowedPorts = []int32{443, 22, 16509, 8006}
			r := ref(inst)
			r.Mark = req.Mark
			if _, err := e.d.Update(context.Background(), r, req); err != nil {
				t.Fatal(err)
			}
			e.host.mu.Lock()
			staged := e.host.guestFiles[stageDir+"/squid.conf"]
			e.host.mu.Unlock()
			conf, err := base64.StdEncoding.DecodeString(staged)
			if err != nil || len(conf) == 0 {
				t.Fatalf("the update wrote no squid.conf (%v)", err)
			}
			if !squidtest.NeverDenies(string(conf), want) {
				t.Errorf("the updated squid.conf does not deny the host at %s:\n%s", want, conf)
			}
		})
	}
}

// TestHypervisorThatDoesNotResolveFailsClosed: a host whose name does
// not resolve stops a create before anything is made on the host, and an
// update before anything is written in the guest, with a Transient error
// naming the config's field and the name, never the resolver's server.
func TestHypervisorThatDoesNotResolveFailsClosed(t *testing.T) {
	e := newTestEnv(t)
	req := e.request("web", "uid-1")
	inst := createAndBootReq(t, e, req)
	delete(e.resolver, "fakehost")

	check := func(op string, err error) {
		t.Helper()
		var pe *proxy.Error
		if !errors.As(err, &pe) || pe.Class != proxy.ClassTransient {
			t.Fatalf("%s: %v; want a Transient error", op, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "kvm.hosts[0].address") || !strings.Contains(msg, `"fakehost"`) || strings.Contains(msg, "10.96.0.10") {
			t.Errorf("%s: %q does not name the field and the host, or names the resolver", op, msg)
		}
	}
	other := e.request("other", "uid-2")
	_, err := e.d.Create(context.Background(), other)
	check("create", err)
	e.host.mu.Lock()
	_, made := e.host.domains["other"]
	e.host.mu.Unlock()
	if made {
		t.Error("the create defined a domain")
	}

	req.Proxy.AllowedPorts = []int32{443, 8443}
	r := ref(inst)
	r.Mark = req.Mark
	e.host.mu.Lock()
	e.host.guestFiles = map[string]string{}
	e.host.mu.Unlock()
	_, err = e.d.Update(context.Background(), r, req)
	check("update", err)
	e.host.mu.Lock()
	written := len(e.host.guestFiles)
	e.host.mu.Unlock()
	if written != 0 {
		t.Error("the update wrote files in the guest")
	}
}

// TestGuestsDenyEveryHostOfTheConfig: a guest's Squid denies the other
// hosts of its config too (they trust the same network and the provider's
// keys), on create and on update; one whose name does not resolve stops
// the create, naming its own field.
func TestGuestsDenyEveryHostOfTheConfig(t *testing.T) {
	e := newTestEnv(t, func(e *testEnv) {
		e.cfg.Hosts = append(e.cfg.Hosts, Host{Name: "lab2", Address: "fakehost2:22", User: "proxy", Bridge: "br0"},
			Host{Name: "lab3", Address: "[2001:db8::7]:22", User: "proxy", Bridge: "br0"})
	})
	req := e.request("web", "uid-1")
	req.Proxy.AllowedPorts = []int32{443, 22, 16509}
	hosts := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8::7")}
	p, err := e.d.plan(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	conf := cloudinit.SquidConfOf(p.userData)
	for _, a := range hosts {
		if !squidtest.NeverDenies(conf, a) {
			t.Errorf("the seed's squid.conf of a guest on lab does not deny the config's host at %s:\n%s", a, conf)
		}
	}

	inst := createAndBootReq(t, e, req)
	r := ref(inst)
	r.Mark = req.Mark
	req.Proxy.AllowedPorts = []int32{443, 22}
	if _, err := e.d.Update(context.Background(), r, req); err != nil {
		t.Fatal(err)
	}
	e.host.mu.Lock()
	staged := e.host.guestFiles[stageDir+"/squid.conf"]
	e.host.mu.Unlock()
	b, err := base64.StdEncoding.DecodeString(staged)
	if err != nil || len(b) == 0 {
		t.Fatalf("the update wrote no squid.conf (%v)", err)
	}
	for _, a := range hosts {
		if !squidtest.NeverDenies(string(b), a) {
			t.Errorf("the updated squid.conf does not deny the config's host at %s", a)
		}
	}

	e.cfg.Hosts = append(e.cfg.Hosts, Host{Name: "lab4", Address: "gone.internal:22", User: "proxy", Bridge: "br0"})
	d := e.b.Driver(e.cfg)
	_, err = d.Create(context.Background(), e.request("other", "uid-2"))
	var pe *proxy.Error
	if !errors.As(err, &pe) || pe.Class != proxy.ClassTransient || !strings.Contains(err.Error(), "kvm.hosts[3].address") {
		t.Errorf("create with a host that does not resolve: %v; want a Transient error naming kvm.hosts[3].address", err)
	}
}
