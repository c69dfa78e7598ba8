package proxmox_test

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit/guesttest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestSeedRemovesCredentialsTurnedOff: a VM that booted with auth and
// TLS, updated with both off, reads a new seed whose cloud-init run
// leaves no htpasswd, certificate or key on the guest, installed or
// staged; no seed on the ISO storage holds them any more either.
func TestSeedRemovesCredentialsTurnedOff(t *testing.T) {
	const password = "pw-S3NT1NEL-pve-off"
	f := newFixture(t)
	ctx := context.Background()
	certs := testenv.NewCerts(t, "proxy.example")
	tlsOf, err := squid.LoadTLS(certs.Secret(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-off", "7c8d9e0f-5555-4a5e-9d55-0a9c1f1e2b3c")}
	r.req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: password}
	r.req.Proxy.TLS = tlsOf
	r.converge(ctx, 20)
	before := vmNamed(t, f.fake, r.req.Name)
	hash, keyLine := cloudinit.HtpasswdOf(before.Seed.UserData), strings.Split(certs.Key, "\n")[1]
	if hash == "" {
		t.Fatal("the first seed installs no htpasswd")
	}
	g := guesttest.New(t)
	g.Boot(before.Seed.UserData)

	r.req.Proxy.Auth, r.req.Proxy.TLS = proxy.Auth{}, nil
	r.converge(ctx, 20)
	after := vmNamed(t, f.fake, r.req.Name)
	if after.Boots != before.Boots+1 || after.Seed.MetaData == before.Seed.MetaData {
		t.Fatalf("boots %d -> %d, meta-data changed %v; want one reboot into a new instance ID",
			before.Boots, after.Boots, after.Seed.MetaData != before.Seed.MetaData)
	}
	g.Boot(after.Seed.UserData)
	for _, p := range append(cloudinit.HtpasswdFiles(), cloudinit.TLSFiles()...) {
		if _, ok := g.ReadFile(p); ok {
			t.Errorf("%s stays on the guest after it was turned off", p)
		}
	}
	for p, content := range g.Files() {
		if strings.Contains(content, hash) || strings.Contains(content, keyLine) {
			t.Errorf("%s on the guest still holds a credential turned off", p)
		}
	}
	if got, _ := g.ReadFile(cloudinit.SquidConfPath); got != cloudinit.SquidConfOf(after.Seed.UserData) {
		t.Error("the new seed did not install its squid.conf")
	}
	for _, v := range f.fake.Volumes() {
		ud := v.Seed.UserData
		if strings.Contains(ud, base64.StdEncoding.EncodeToString([]byte(hash))) || cloudinit.HtpasswdOf(ud) != "" {
			t.Errorf("seed %s still holds the htpasswd", v.VolID)
		}
		if _, key := cloudinit.TLSOf(ud); key != "" {
			t.Errorf("seed %s still holds the key", v.VolID)
		}
		for _, secret := range []string{password, hash, keyLine} {
			if strings.Contains(ud, secret) {
				t.Errorf("seed %s holds a credential in clear", v.VolID)
			}
		}
	}
}

// TestSpecRevertedRunsAgain: a spec changed and changed back (auth on,
// off, on again with the same password) gives the guest a seed that
// cloud-init runs: an instance ID it has run before would run nothing,
// leaving the guest without auth while its resource asks for it.
func TestSpecRevertedRunsAgain(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-back", "1e2d3c4b-6666-4a5e-9d55-0a9c1f1e2b3c")}
	on := proxy.Auth{Enabled: true, Username: "u", Password: "pw-back-and-forth"}
	r.req.Proxy.Auth = on
	r.converge(ctx, 20)
	first := vmNamed(t, f.fake, r.req.Name)
	r.req.Proxy.Auth = proxy.Auth{}
	r.converge(ctx, 20)
	if vm := vmNamed(t, f.fake, r.req.Name); cloudinit.HtpasswdOf(vm.Seed.UserData) != "" {
		t.Fatal("the guest kept auth after it was turned off")
	}
	r.req.Proxy.Auth = on
	r.converge(ctx, 20)
	last := vmNamed(t, f.fake, r.req.Name)
	if last.Boots != first.Boots+2 {
		t.Errorf("boots %d -> %d; want two reboots", first.Boots, last.Boots)
	}
	if cloudinit.HtpasswdOf(last.Seed.UserData) == "" {
		t.Errorf("the guest runs without auth after it was turned on again (its seed's %q was run before)", last.Seed.InstanceID())
	}
}
