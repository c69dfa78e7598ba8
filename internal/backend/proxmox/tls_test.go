package proxmox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestSeedCarriesTLS: a proxy with TLS boots from a seed whose user-data
// installs its certificate and key and a squid.conf listening with
// https_port; a renewed certificate reaches the VM as a new seed and one
// reboot.
func TestSeedCarriesTLS(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	certs := testenv.NewCerts(t, "proxy.example")
	tlsOf, err := squid.LoadTLS(certs.Secret(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r := &reconciler{t: t, f: f, drv: f.drv, req: f.request("pt-tls", "7c8d9e0f-4444-4a5e-9d55-0a9c1f1e2b3c")}
	r.req.Proxy.TLS = tlsOf
	r.converge(ctx, 20)
	before := vmNamed(t, f.fake, r.req.Name)
	cert, key := cloudinit.TLSOf(before.Seed.UserData)
	if cert != certs.Chain || key != certs.Key {
		t.Errorf("the seed installs certificate %v, key %v; want the proxy's", cert == certs.Chain, key == certs.Key)
	}
	if conf := cloudinit.SquidConfOf(before.Seed.UserData); !strings.Contains(conf, "\nhttps_port 3128 tls-cert="+cloudinit.TLSCertPath+" tls-key="+cloudinit.TLSKeyPath+"\n") {
		t.Errorf("the seed's squid.conf does not listen with TLS:\n%s", conf)
	}

	renewed := testenv.NewCerts(t, "proxy.example")
	r.req.Proxy.TLS, err = squid.LoadTLS(renewed.Secret(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r.converge(ctx, 20)
	after := vmNamed(t, f.fake, r.req.Name)
	if cert, key := cloudinit.TLSOf(after.Seed.UserData); cert != renewed.Chain || key != renewed.Key {
		t.Errorf("after the renewal the seed installs the new certificate %v, key %v; want both", cert == renewed.Chain, key == renewed.Key)
	}
	if after.Boots != before.Boots+1 || !strings.Contains(after.Tags, proxy.Hash(r.req)) {
		t.Errorf("boots %d -> %d, tags %q; want one reboot and the new spec hash", before.Boots, after.Boots, after.Tags)
	}
	for _, l := range f.fake.Requests() {
		if strings.Contains(fmt.Sprint(l), strings.Split(certs.Key, "\n")[1]) {
			t.Errorf("the key is in the request log: %s", l.Path)
		}
	}
}
