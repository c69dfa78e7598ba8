package cloudinit_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit/guesttest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

const (
	password = "SENTINEL-pw-0123456789abcdef"
	keyLine  = "MHcCAQEEIKEYSENTINELkeymaterial0123456789abcdefghijklmnopqrs"
)

// userData renders the user-data of a proxy with auth and TLS as given.
func userData(t *testing.T, auth, tls bool) (string, squid.Files) {
	t.Helper()
	s := proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{443}}
	if auth {
		s.Auth = proxy.Auth{Enabled: true, Username: "proxy", Password: password}
	}
	if tls {
		s.TLS = &proxy.TLS{Cert: "-----BEGIN CERTIFICATE-----\nchain\n-----END CERTIFICATE-----\n",
			Key: "-----BEGIN EC PRIVATE KEY-----\n" + keyLine + "\n-----END EC PRIVATE KEY-----\n", CA: "ca"}
	}
	f, err := squid.Render(s, cloudinit.SquidOptions("uid-1"))
	if err != nil {
		t.Fatal(err)
	}
	ud, err := cloudinit.UserData(cloudinit.Options{Squid: f, InstallGuestAgent: true, Hostname: "p-1"})
	if err != nil {
		t.Fatal(err)
	}
	return ud, f
}

// TestSeedRunAgainRemovesUnnamedCredentials: a guest that ran the
// user-data of a proxy with auth and TLS, then runs it again with a
// feature turned off (a Proxmox update's new seed), is left with no copy
// of that feature's credential, installed or staged, and keeps the other
// one. The removal names paths only, never a credential.
func TestSeedRunAgainRemovesUnnamedCredentials(t *testing.T) {
	cases := map[string]struct{ auth, tls bool }{
		"AuthOff": {false, true},
		"TLSOff":  {true, false},
		"BothOff": {false, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := guesttest.New(t)
			first, old := userData(t, true, true)
			g.Boot(first)
			if got, _ := g.ReadFile(cloudinit.HtpasswdPath); got != old.Htpasswd {
				t.Fatal("the first boot did not install the htpasswd")
			}
			if got, _ := g.ReadFile(cloudinit.TLSKeyPath); got != old.TLSKey {
				t.Fatal("the first boot did not install the TLS key")
			}

			again, now := userData(t, tc.auth, tc.tls)
			g.Boot(again)
			if got, _ := g.ReadFile(cloudinit.SquidConfPath); got != now.SquidConf {
				t.Error("the second run did not install the new squid.conf")
			}
			for _, c := range []struct {
				on    bool
				files []string
			}{{tc.auth, cloudinit.HtpasswdFiles()}, {tc.tls, cloudinit.TLSFiles()}} {
				for _, p := range c.files {
					if _, ok := g.ReadFile(p); ok != c.on {
						t.Errorf("%s on the guest: %v; want %v", p, ok, c.on)
					}
				}
			}
			for p, content := range g.Files() {
				if !tc.auth && strings.Contains(content, old.Htpasswd) {
					t.Errorf("%s still holds the htpasswd of auth turned off", p)
				}
				if !tc.tls && strings.Contains(content, keyLine) {
					t.Errorf("%s still holds the key of TLS turned off", p)
				}
			}
			for _, secret := range []string{password, old.Htpasswd, keyLine, base64.StdEncoding.EncodeToString([]byte(old.Htpasswd)),
				base64.StdEncoding.EncodeToString([]byte(old.TLSKey))} {
				if rm := runcmdOf(again); strings.Contains(rm, secret) {
					t.Errorf("the second run's runcmd holds a credential")
				}
			}
		})
	}
}

// TestFirstBootWithoutCredentials: the removal on a guest that never had
// the files does not fail its first boot.
func TestFirstBootWithoutCredentials(t *testing.T) {
	g := guesttest.New(t)
	ud, f := userData(t, false, false)
	g.Boot(ud)
	if got, _ := g.ReadFile(cloudinit.SquidConfPath); got != f.SquidConf {
		t.Error("squid.conf not installed")
	}
}

// runcmdOf is the runcmd line of the generated part of ud.
func runcmdOf(ud string) string {
	_, after, _ := strings.Cut(ud, "\nruncmd:\n")
	return after
}
