package gcp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit/guesttest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// metadataItem is the value of an instance body's metadata item key.
func metadataItem(body map[string]any, key string) string {
	md, _ := body["metadata"].(map[string]any)
	items, _ := md["items"].([]any)
	for _, it := range items {
		if m, ok := it.(map[string]any); ok && m["key"] == key {
			v, _ := m["value"].(string)
			return v
		}
	}
	return ""
}

// TestMetadataCarriesTLS: a proxy with TLS gets its certificate and key in
// its cloud-init user-data (first boot) and in the metadata the startup
// script installs at every boot, with a squid.conf listening with
// https_port; a renewed certificate is an instances.update that restarts
// the VM; turning TLS off leaves no key in metadata (the user-data
// included), and the startup script then removes every copy from the
// guest.
func TestMetadataCarriesTLS(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	certs := testenv.NewCerts(t, "proxy.example")
	tlsOf, err := squid.LoadTLS(certs.Secret(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	req := request("pt-tls", "0c8f6a1e-4444-4e2a-9c3f-00000000000b")
	req.Extension = gcp.Exposure{AddressType: gcp.AddressEphemeral}
	req.Proxy.TLS = tlsOf
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.SettleAll()
	body, _ := f.srv.Instance(testZone, req.Name)
	if metadataItem(body, gcp.MetadataTLSCert) != certs.Chain || metadataItem(body, gcp.MetadataTLSKey) != certs.Key {
		t.Errorf("metadata lacks the certificate or key")
	}
	ud := metadataItem(body, gcp.MetadataUserData)
	g := guesttest.New(t)
	g.Boot(ud)
	if cert, key := cloudinit.TLSOf(ud); cert != certs.Chain || key != certs.Key {
		t.Errorf("user-data installs certificate %v, key %v; want both", cert == certs.Chain, key == certs.Key)
	}
	conf := metadataItem(body, gcp.MetadataSquidConf)
	if !strings.Contains(conf, "\nhttps_port 3128 tls-cert="+cloudinit.TLSCertPath+" tls-key="+cloudinit.TLSKeyPath+"\n") {
		t.Errorf("squid.conf in metadata does not listen with TLS:\n%s", conf)
	}
	script := metadataItem(body, gcp.MetadataStartupScript)
	for _, w := range []string{gcp.MetadataTLSCert, gcp.MetadataTLSKey, `install -m 0640 -o root -g "$(egp_squid_group)" ` + cloudinit.TLSKeyPath + ".new " + cloudinit.TLSKeyPath} {
		if !strings.Contains(script, w) {
			t.Errorf("the startup script does not mention %q", w)
		}
	}

	renewed := testenv.NewCerts(t, "proxy.example")
	req.Proxy.TLS, err = squid.LoadTLS(renewed.Secret(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f.srv.ResetRequests()
	if _, err := f.driver.Update(ctx, refOf(inst, req), req); err != nil {
		t.Fatal(err)
	}
	if reqs := fmt.Sprint(f.srv.Requests()); !strings.Contains(reqs, "minimalAction=RESTART") {
		t.Errorf("a renewed certificate did not restart the VM: %s", reqs)
	}
	f.srv.SettleAll()
	body, _ = f.srv.Instance(testZone, req.Name)
	if metadataItem(body, gcp.MetadataTLSKey) != renewed.Key {
		t.Errorf("metadata does not hold the renewed key")
	}

	req.Proxy.TLS = nil
	if _, err := f.driver.Update(ctx, refOf(inst, req), req); err != nil {
		t.Fatal(err)
	}
	f.srv.SettleAll()
	body, _ = f.srv.Instance(testZone, req.Name)
	if metadataItem(body, gcp.MetadataTLSKey) != "" || metadataItem(body, gcp.MetadataTLSCert) != "" {
		t.Errorf("TLS turned off: the certificate or key stays in metadata")
	}
	if _, key := cloudinit.TLSOf(metadataItem(body, gcp.MetadataUserData)); key != "" {
		t.Errorf("TLS turned off: the user-data in metadata still stages a key")
	}
	restart(t, g, body)
	for _, p := range cloudinit.TLSFiles() {
		if _, ok := g.ReadFile(p); ok {
			t.Errorf("TLS turned off: %s stays on the guest", p)
		}
	}
	if !strings.Contains(metadataItem(body, gcp.MetadataSquidConf), "\nhttp_port 3128\n") {
		t.Errorf("TLS turned off: squid.conf does not listen with http_port")
	}
}
