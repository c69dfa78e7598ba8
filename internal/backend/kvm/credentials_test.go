package kvm

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit/guesttest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestCredentialsTurnedOffLeaveTheGuest: a proxy that booted with auth
// and TLS and is updated with one of them off is left with no copy of
// that one's credential on its guest, installed or staged, once the guest
// agent's script ran; the other stays. The script names paths, never a
// credential.
func TestCredentialsTurnedOffLeaveTheGuest(t *testing.T) {
	const password = "pw-S3NT1NEL-off"
	cases := map[string]struct{ auth, tls bool }{
		"AuthOff": {false, true},
		"TLSOff":  {true, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t)
			certs := testenv.NewCerts(t, "proxy.example")
			tlsOf, err := squid.LoadTLS(certs.Secret(), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			req := e.request("web", "uid-1")
			req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: password}
			req.Proxy.TLS = tlsOf
			inst := createAndBootReq(t, e, req)
			g := guesttest.New(t)
			seed := e.seedUserData(seedName("web"))
			g.Boot(seed)
			hash, keyLine := cloudinit.HtpasswdOf(seed), strings.Split(certs.Key, "\n")[1]
			if got, _ := g.ReadFile(cloudinit.HtpasswdPath); got == "" || got != hash {
				t.Fatal("the first boot did not install the htpasswd")
			}

			if !tc.auth {
				req.Proxy.Auth = proxy.Auth{}
			}
			if !tc.tls {
				req.Proxy.TLS = nil
			}
			r := ref(inst)
			r.Mark = req.Mark
			if _, err := e.d.Update(context.Background(), r, req); err != nil {
				t.Fatal(err)
			}
			_, execs := runAgentUpdate(t, e, g)

			for _, c := range []struct {
				on    bool
				files []string
			}{{tc.auth, cloudinit.HtpasswdFiles()}, {tc.tls, cloudinit.TLSFiles()}} {
				for _, p := range c.files {
					if _, ok := g.ReadFile(p); ok && !c.on {
						t.Errorf("%s stays on the guest after it was turned off", p)
					}
				}
			}
			if _, ok := g.ReadFile(cloudinit.TLSKeyPath); ok != tc.tls {
				t.Errorf("the TLS key on the guest: %v; want %v", ok, tc.tls)
			}
			if _, ok := g.ReadFile(cloudinit.HtpasswdPath); ok != tc.auth {
				t.Errorf("the htpasswd on the guest: %v; want %v", ok, tc.auth)
			}
			for p, content := range g.Files() {
				if !tc.auth && strings.Contains(content, hash) {
					t.Errorf("%s still holds the htpasswd of auth turned off", p)
				}
				if !tc.tls && strings.Contains(content, keyLine) {
					t.Errorf("%s still holds the key of TLS turned off", p)
				}
			}
			script := fmt.Sprint(execs)
			for _, secret := range []string{password, hash, keyLine} {
				if strings.Contains(script, secret) {
					t.Error("the guest agent's script holds a credential")
				}
			}
		})
	}
}

// TestUpdateOnAnotherFamily: on a guest whose Squid runs in group squid
// (Fedora, RHEL, openSUSE), as cloud-init provisions it, the guest agent's
// script installs a changed user's htpasswd too: it finds the group
// and the service manager as the first boot did.
func TestUpdateOnAnotherFamily(t *testing.T) {
	e := newTestEnv(t)
	req := e.request("web", "uid-1")
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: "first-password"}
	inst := createAndBootReq(t, e, req)
	g := guesttest.New(t)
	g.SquidGroup("squid")
	g.Boot(e.seedUserData(seedName("web")))

	// Another user: a password enters the spec hash through the
	// controller's SecretDigest, which this driver test leaves alone.
	req.Proxy.Auth.Username, req.Proxy.Auth.Password = "v", "second-password"
	r := ref(inst)
	r.Mark = req.Mark
	if _, err := e.d.Update(context.Background(), r, req); err != nil {
		t.Fatal(err)
	}
	written, _ := runAgentUpdate(t, e, g)
	staged := written[stageDir+"/htpasswd"]
	if staged == "" {
		t.Fatal("the update staged no htpasswd")
	}
	if got, _ := g.ReadFile(cloudinit.HtpasswdPath); got != staged {
		t.Error("the agent's script did not install the new htpasswd on a guest whose Squid group is squid")
	}
}

// TestUpdateLocksTheStagingFolder: whatever the guest had, an Update
// through the guest agent leaves the staging folder 0700 and the staged
// htpasswd 0600. A guest first booted by an earlier rendering has the
// folder 0755 and the staged htpasswd 0644, which a process of the guest
// holds open: that process reads nothing of the new htpasswd. A guest
// whose auth is turned on after its first boot gets the staged htpasswd
// as a new file, which the agent creates 0666.
func TestUpdateLocksTheStagingFolder(t *testing.T) {
	staged := stageDir + "/htpasswd"
	for name, earlier := range map[string]bool{"BootedByAnEarlierRendering": true, "AuthTurnedOn": false} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t)
			req := e.request("web", "uid-1")
			if earlier {
				req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: "first-password"}
			}
			inst := createAndBootReq(t, e, req)
			g := guesttest.New(t)
			g.Boot(e.seedUserData(seedName("web")))
			var held *os.File
			if earlier {
				for p, mode := range map[string]os.FileMode{stageDir: 0o755, staged: 0o644} {
					if err := os.Chmod(g.Path(p), mode); err != nil {
						t.Fatal(err)
					}
				}
				f, err := os.Open(g.Path(staged))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = f.Close() })
				held = f
			}

			req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "v", Password: "second-password"}
			r := ref(inst)
			r.Mark = req.Mark
			update(t, e, g, r, req)

			if mode, _ := g.Mode(stageDir); mode != 0o700 {
				t.Errorf("the staging folder is %04o after the update; want 0700", mode)
			}
			installed, _ := g.ReadFile(cloudinit.HtpasswdPath)
			if got, ok := g.ReadFile(staged); !ok || got != installed || !strings.HasPrefix(got, "v:") {
				t.Fatal("the staged htpasswd is not the one the update installed")
			}
			if mode, _ := g.Mode(staged); mode != 0o600 {
				t.Errorf("the staged htpasswd is %04o after the update; want 0600", mode)
			}
			if held != nil {
				if b, err := io.ReadAll(held); err != nil || strings.Contains(string(b), "v:") {
					t.Errorf("a process holding the earlier staged htpasswd open reads the new one (%v)", err)
				}
			}
		})
	}
}

// runAgentUpdate plays on g what the guest agent did on e's host for an
// update, in its order: the files it wrote (path: content, returned) and
// its guest-execs (returned too).
func runAgentUpdate(t *testing.T, e *testEnv, g *guesttest.Guest) (map[string]string, [][]string) {
	t.Helper()
	e.host.mu.Lock()
	ops := slices.Clone(e.host.agentOps)
	e.host.mu.Unlock()
	files := map[string]string{}
	var execs [][]string
	for _, op := range ops {
		if op.argv != nil {
			g.Exec(op.argv...)
			execs = append(execs, op.argv)
			continue
		}
		b, err := base64.StdEncoding.DecodeString(op.b64)
		if err != nil {
			t.Fatal(err)
		}
		g.AgentWrite(op.path, string(b))
		files[op.path] = string(b)
	}
	if len(execs) == 0 {
		t.Fatal("the update ran nothing in the guest")
	}
	return files, execs
}

// TestEgressCheckFollowsTheSettings: the guest's own egress check follows
// an update as Squid's files do. A changed echo URL and port rewrite its
// request and script and drop the report made with the old ones (read
// otherwise as the guest's word on the new ones); turned off, nothing of
// it stays: not its credential, not its timer, not its last report.
func TestEgressCheckFollowsTheSettings(t *testing.T) {
	e := newTestEnv(t)
	req := e.request("web", "uid-1")
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo-one.example/ip", Username: "egressproxy-check", Password: "check-S3NT1NEL-one"}
	inst := createAndBootReq(t, e, req)
	g := guesttest.New(t)
	g.Boot(e.seedUserData(seedName("web")))
	first, _ := g.ReadFile(cloudinit.EgressCheckFiles(cloudinit.ReportOf(req.Proxy, false))[0].Path)
	if !strings.Contains(first, "echo-one.example") {
		t.Fatal("the first boot wrote no egress check request")
	}
	g.WriteFile(cloudinit.ReportPath, "egressproxy-egress-check 1700000000 200 203.0.113.7\n")
	r := ref(inst)
	r.Mark = req.Mark

	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo-two.example/ip", Username: "egressproxy-check", Password: "check-S3NT1NEL-two"}
	req.Proxy.Port = 3130
	update(t, e, g, r, req)
	for _, f := range cloudinit.EgressCheckFiles(cloudinit.ReportOf(req.Proxy, false)) {
		if got, _ := g.ReadFile(f.Path); got != f.Content {
			t.Errorf("%s after the update:\n%s\nwant:\n%s", f.Path, got, f.Content)
		}
	}
	if _, ok := g.ReadFile(cloudinit.ReportPath); ok {
		t.Error("the report made with the old check stays after the update")
	}

	g.WriteFile(cloudinit.ReportPath, "egressproxy-egress-check 1700000000 200 203.0.113.8\n")
	req.Proxy.EgressCheck = nil
	update(t, e, g, r, req)
	for p, content := range g.Files() {
		if strings.Contains(p, "egress-check") || strings.Contains(content, "S3NT1NEL") || strings.Contains(content, "Proxy-Authorization") {
			t.Errorf("%s stays on the guest after the check was turned off", p)
		}
	}
}

// update runs req's Update on e's driver and plays what the guest agent
// did on g.
func update(t *testing.T, e *testEnv, g *guesttest.Guest, r proxy.Ref, req proxy.Request) {
	t.Helper()
	e.host.mu.Lock()
	e.host.guestFiles, e.host.execArgv, e.host.agentOps = map[string]string{}, nil, nil
	e.host.mu.Unlock()
	if _, err := e.d.Update(context.Background(), r, req); err != nil {
		t.Fatal(err)
	}
	runAgentUpdate(t, e, g)
}
