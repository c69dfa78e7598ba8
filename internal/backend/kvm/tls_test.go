package kvm

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kdomanski/iso9660"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// seedUserData is the user-data of the seed ISO in volume name.
func (e *testEnv) seedUserData(name string) string {
	e.t.Helper()
	ud, ok := e.seedFile(name, "user-data")
	if !ok {
		e.t.Fatalf("seed %s has no user-data", name)
	}
	return ud
}

// seedFile is the file of the seed ISO in volume name; ok is false when
// it has none.
func (e *testEnv) seedFile(name, file string) (content string, ok bool) {
	e.t.Helper()
	e.host.mu.Lock()
	iso := bytes.Clone(e.host.pools["default"].vols[name].content)
	e.host.mu.Unlock()
	img, err := iso9660.OpenImage(bytes.NewReader(iso))
	if err != nil {
		e.t.Fatal(err)
	}
	root, err := img.RootDir()
	if err != nil {
		e.t.Fatal(err)
	}
	children, err := root.GetChildren()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range children {
		if c.Name() == file {
			b, _ := io.ReadAll(c.Reader())
			return string(b), true
		}
	}
	return "", false
}

// TestTLSInTheSeedAndThroughTheAgent: a proxy with TLS boots from a seed
// whose user-data installs its certificate and key and a squid.conf
// listening with https_port; a renewed certificate is written through the
// guest agent and installed (the key for Squid's group only) before Squid
// reloads; the key is in no log.
func TestTLSInTheSeedAndThroughTheAgent(t *testing.T) {
	e := newTestEnv(t)
	certs := testenv.NewCerts(t, "proxy.example")
	tlsOf, err := squid.LoadTLS(certs.Secret(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	req := e.request("web", "uid-1")
	req.Proxy.TLS = tlsOf
	inst := createAndBootReq(t, e, req)
	ud := e.seedUserData(seedName("web"))
	if cert, key := cloudinit.TLSOf(ud); cert != certs.Chain || key != certs.Key {
		t.Errorf("the seed installs certificate %v, key %v; want both", cert == certs.Chain, key == certs.Key)
	}
	if conf := cloudinit.SquidConfOf(ud); !strings.Contains(conf, "\nhttps_port 3128 tls-cert="+cloudinit.TLSCertPath+" tls-key="+cloudinit.TLSKeyPath+"\n") {
		t.Errorf("the seed's squid.conf does not listen with TLS:\n%s", conf)
	}

	renewed := testenv.NewCerts(t, "proxy.example")
	if req.Proxy.TLS, err = squid.LoadTLS(renewed.Secret(), time.Now()); err != nil {
		t.Fatal(err)
	}
	r := ref(inst)
	r.Mark = req.Mark
	got, err := e.d.Update(context.Background(), r, req)
	if err != nil {
		t.Fatal(err)
	}
	if got.SpecHash != proxy.Hash(req) {
		t.Errorf("SpecHash %q after the renewal; want %q", got.SpecHash, proxy.Hash(req))
	}
	e.host.mu.Lock()
	files, execs := e.host.guestFiles, e.host.execs
	e.host.mu.Unlock()
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	if files[stageDir+"/tls.crt"] != b64(renewed.Chain) || files[stageDir+"/tls.key"] != b64(renewed.Key) {
		t.Errorf("the agent did not write the renewed certificate and key: %v", keys(files))
	}
	if len(execs) != 2 || !strings.Contains(execs[1], `install -m 0640 -o root -g "$(egp_squid_group)" `+stageDir+"/tls.key "+cloudinit.TLSKeyPath) ||
		!strings.Contains(execs[1], "rm -f "+stageDir+"/tls.key") || !strings.Contains(execs[1], "egp_reload squid") {
		t.Errorf("execs %v; want the key installed for Squid's group, the staged copy removed and Squid reloaded", execs)
	}
	if line := strings.Split(renewed.Key, "\n")[1]; strings.Contains(e.logs.String(), line) || strings.Contains(e.logs.String(), strings.Split(certs.Key, "\n")[1]) {
		t.Error("a key leaked into the log")
	}
}
