package gcp_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit/guesttest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// metadataItems are an instance body's metadata, key: value.
func metadataItems(body map[string]any) map[string]string {
	out := map[string]string{}
	md, _ := body["metadata"].(map[string]any)
	items, _ := md["items"].([]any)
	for _, it := range items {
		m, _ := it.(map[string]any)
		k, _ := m["key"].(string)
		v, _ := m["value"].(string)
		out[k] = v
	}
	return out
}

// restart runs the instance's startup script on g, as the guest
// environment does at boot, with the metadata server answering from body.
func restart(t *testing.T, g *guesttest.Guest, body map[string]any) {
	t.Helper()
	restartWith(t, g, body, "", "-c")
}

// restartWith is restart with the shell's flags (-c, or -ec as
// cloud-init's runcmd), and pre run first by every curl the script runs.
func restartWith(t *testing.T, g *guesttest.Guest, body map[string]any, pre, flags string) {
	t.Helper()
	dir := t.TempDir()
	g.Tool("curl", pre+`
for a; do u=$a; done; f="`+dir+`/${u##*/}"
case "$*" in *http_code*) if [ -f "$f" ]; then printf 200; else printf 404; fi; exit 0;; esac
[ -f "$f" ] && cat "$f"`)
	for k, v := range metadataItems(body) {
		if strings.Contains(k, "/") {
			t.Fatalf("metadata key %q", k)
		}
		if err := os.WriteFile(dir+"/"+k, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	g.Exec("sh", flags, metadataItem(body, gcp.MetadataStartupScript))
}

// created creates req's instance with f's driver and lets its operations
// finish: the instance, and its body as the API holds it.
func created(t *testing.T, f *fixture, req proxy.Request) (proxy.Instance, map[string]any) {
	t.Helper()
	inst, err := f.driver.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.SettleAll()
	body, _ := f.srv.Instance(testZone, req.Name)
	return inst, body
}

// updated updates inst to req with f's driver and lets its operations
// finish: the instance's body as the API then holds it.
func updated(t *testing.T, f *fixture, inst proxy.Instance, req proxy.Request) map[string]any {
	t.Helper()
	if _, err := f.driver.Update(context.Background(), refOf(inst, req), req); err != nil {
		t.Fatal(err)
	}
	f.srv.SettleAll()
	body, _ := f.srv.Instance(testZone, req.Name)
	return body
}

// TestMetadataServerDownTurnsNothingOff: a boot at which the metadata
// server does not answer leaves the guest's files as they are; only a key
// the server says is not there turns its file off.
func TestMetadataServerDownTurnsNothingOff(t *testing.T) {
	f := newFixture(t)
	req := request("pt-md-down", "0c8f6a1e-4444-4e2a-9c3f-000000000011")
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: "a-password"}
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo.example/ip", Username: "egressproxy-check", Password: "a-check-password"}
	_, body := created(t, f, req)
	g := guesttest.New(t)
	g.Boot(metadataItem(body, gcp.MetadataUserData))
	kept := []string{cloudinit.HtpasswdPath}
	for _, gf := range cloudinit.EgressCheckFiles(cloudinit.ReportOf(req.Proxy, true)) {
		kept = append(kept, gf.Path)
	}
	for _, p := range kept {
		if _, ok := g.ReadFile(p); !ok {
			t.Fatalf("the first boot did not write %s", p)
		}
	}
	// As curl says when nothing answers: no body, status 000, exit 7.
	g.Tool("curl", `case "$*" in *http_code*) printf 000;; esac; exit 7`)
	g.Exec("sh", "-c", metadataItem(body, gcp.MetadataStartupScript))
	for _, p := range kept {
		if _, ok := g.ReadFile(p); !ok {
			t.Errorf("%s is gone after a boot at which the metadata server did not answer", p)
		}
	}
}

// TestAuthOffLeavesNoHash: after an update turning auth off, the
// instance's metadata holds the htpasswd nowhere (no egressproxy-htpasswd
// key, a user-data that stages none), the update restarts the VM, and its
// startup script leaves no copy of the htpasswd on a guest that booted
// with one. The script names paths, never the hash.
func TestAuthOffLeavesNoHash(t *testing.T) {
	const password = "pw-S3NT1NEL-gcp-off"
	f := newFixture(t)
	ctx := context.Background()
	req := request("pt-auth-off", "0c8f6a1e-4444-4e2a-9c3f-00000000000c")
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: password}
	inst, body := created(t, f, req)
	hash := metadataItem(body, gcp.MetadataHtpasswd)
	if hash == "" || cloudinit.HtpasswdOf(metadataItem(body, gcp.MetadataUserData)) != hash {
		t.Fatal("the instance was not created with the htpasswd in metadata and user-data")
	}
	g := guesttest.New(t)
	g.Boot(metadataItem(body, gcp.MetadataUserData))

	req.Proxy.Auth = proxy.Auth{}
	f.srv.ResetRequests()
	if _, err := f.driver.Update(ctx, refOf(inst, req), req); err != nil {
		t.Fatal(err)
	}
	if reqs := fmt.Sprint(f.srv.Requests()); !strings.Contains(reqs, "minimalAction=RESTART") {
		t.Errorf("turning auth off did not restart the VM: %s", reqs)
	}
	f.srv.SettleAll()
	body, _ = f.srv.Instance(testZone, req.Name)
	md := metadataItems(body)
	if _, ok := md[gcp.MetadataHtpasswd]; ok {
		t.Errorf("metadata still has %s", gcp.MetadataHtpasswd)
	}
	for k, v := range md {
		if strings.Contains(v, hash) || strings.Contains(v, base64.StdEncoding.EncodeToString([]byte(hash))) {
			t.Errorf("metadata %s still holds the htpasswd", k)
		}
	}
	if md[gcp.MetadataUserData] == "" || cloudinit.SquidConfOf(md[gcp.MetadataUserData]) == "" {
		t.Errorf("metadata lost the user-data")
	}

	restart(t, g, body)
	for _, p := range cloudinit.HtpasswdFiles() {
		if _, ok := g.ReadFile(p); ok {
			t.Errorf("%s stays on the guest after auth was turned off", p)
		}
	}
	for p, content := range g.Files() {
		if strings.Contains(content, hash) {
			t.Errorf("%s on the guest still holds the htpasswd", p)
		}
	}
	if got, _ := g.ReadFile(cloudinit.SquidConfPath); got != md[gcp.MetadataSquidConf] {
		t.Error("the startup script did not install the new squid.conf")
	}
	if script := md[gcp.MetadataStartupScript]; strings.Contains(script, hash) || strings.Contains(script, password) {
		t.Error("the startup script holds a credential")
	}
}

// TestStartupScriptOnAnotherFamily: on a guest whose Squid runs in group
// squid (Fedora, RHEL, openSUSE), as cloud-init provisions it, the
// startup script installs a changed password's htpasswd too: it finds the
// group and the service manager as the first boot did.
func TestStartupScriptOnAnotherFamily(t *testing.T) {
	f := newFixture(t)
	req := request("pt-family", "0c8f6a1e-4444-4e2a-9c3f-00000000000d")
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: "first-password"}
	inst, body := created(t, f, req)
	g := guesttest.New(t)
	g.SquidGroup("squid")
	g.Boot(metadataItem(body, gcp.MetadataUserData))

	req.Proxy.Auth.Password = "second-password"
	body = updated(t, f, inst, req)
	restart(t, g, body)
	if got, _ := g.ReadFile(cloudinit.HtpasswdPath); got == "" || got != metadataItem(body, gcp.MetadataHtpasswd) {
		t.Error("the startup script did not install the new htpasswd on a guest whose Squid group is squid")
	}
}

// TestEgressCheckFollowsTheSettings: the guest's own egress check follows
// an update as Squid's files do. A changed echo URL restarts the VM with
// the new request in metadata (the first boot's user-data, which staged
// the old one, is not kept), and the startup script installs it and drops
// the report made with the old one; turned off, neither metadata nor the
// guest keeps anything of it.
func TestEgressCheckFollowsTheSettings(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	req := request("pt-check", "0c8f6a1e-4444-4e2a-9c3f-00000000000e")
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo-one.example/ip", Username: "egressproxy-check", Password: "check-S3NT1NEL-one"}
	inst, body := created(t, f, req)
	first := cloudinit.EgressRequestOf(metadataItem(body, gcp.MetadataUserData))
	if !strings.Contains(first, "echo-one.example") {
		t.Fatal("the instance was not created with the check's request in its user-data")
	}
	g := guesttest.New(t)
	g.Boot(metadataItem(body, gcp.MetadataUserData))
	g.WriteFile(cloudinit.ReportPath, "egressproxy-egress-check 1700000000 200 203.0.113.7\n")

	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo-two.example/ip", Username: "egressproxy-check", Password: "check-S3NT1NEL-two"}
	f.srv.ResetRequests()
	if _, err := f.driver.Update(ctx, refOf(inst, req), req); err != nil {
		t.Fatal(err)
	}
	if reqs := fmt.Sprint(f.srv.Requests()); !strings.Contains(reqs, "minimalAction=RESTART") {
		t.Errorf("changing the check did not restart the VM: %s", reqs)
	}
	f.srv.SettleAll()
	body, _ = f.srv.Instance(testZone, req.Name)
	for k, v := range metadataItems(body) {
		if strings.Contains(v, first) || strings.Contains(v, base64.StdEncoding.EncodeToString([]byte(first))) {
			t.Errorf("metadata %s still holds the old check's request", k)
		}
	}
	restart(t, g, body)
	for _, gf := range cloudinit.EgressCheckFiles(cloudinit.ReportOf(req.Proxy, true)) {
		if got, _ := g.ReadFile(gf.Path); got != gf.Content {
			t.Errorf("%s after the update:\n%s\nwant:\n%s", gf.Path, got, gf.Content)
		}
	}
	if _, ok := g.ReadFile(cloudinit.ReportPath); ok {
		t.Error("the report made with the old check stays after the update")
	}

	g.WriteFile(cloudinit.ReportPath, "egressproxy-egress-check 1700000000 200 203.0.113.8\n")
	req.Proxy.EgressCheck = nil
	body = updated(t, f, inst, req)
	for k, v := range metadataItems(body) {
		if strings.Contains(k, "egress-check") || strings.Contains(v, "Proxy-Authorization") || strings.Contains(v, "UHJveHktQXV0aG9yaXphdGlvbj") {
			t.Errorf("metadata %s holds the check after it was turned off", k)
		}
	}
	restart(t, g, body)
	for p, content := range g.Files() {
		if strings.Contains(p, "egress-check") || strings.Contains(content, "Proxy-Authorization") {
			t.Errorf("%s stays on the guest after the check was turned off", p)
		}
	}
}

// TestGuestDeletesItsReportAttribute: at a boot that installs the check,
// and at one that finds it turned off, the startup script deletes the
// guest attribute of the last report (made with the settings before),
// before the new check can put its own; a metadata server refusing the
// delete fails nothing, even under sh -e.
func TestGuestDeletesItsReportAttribute(t *testing.T) {
	f := newFixture(t)
	req := request("pt-drop", "0c8f6a1e-4444-4e2a-9c3f-00000000000f")
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: "http://echo.example/ip", Username: "egressproxy-check", Password: "check-pw"}
	inst, body := created(t, f, req)
	g := guesttest.New(t)
	g.Boot(metadataItem(body, gcp.MetadataUserData))
	log := t.TempDir() + "/curl.log"
	// The delete is logged and refused (403, as with guest attributes off).
	pre := `case "$*" in *"-X DELETE"*) for a; do u=$a; done; echo "DELETE $u" >> ` + log + `; exit 22;; esac
case "$*" in *guest-attributes*) echo "PUT" >> ` + log + `;; esac`
	g.Tool("systemctl", `case "$*" in *"start --no-block"*) echo "CHECK" >> `+log+`;; esac; exit 0`)
	deletes := func(when string) string {
		t.Helper()
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatalf("%s: no curl: %v", when, err)
		}
		if err := os.Remove(log); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}

	restartWith(t, g, body, pre, "-ec")
	if got, want := deletes("with the check"), "DELETE "+cloudinit.GuestAttributeURL+"\nCHECK"; got != want {
		t.Errorf("a boot with the check ran:\n%s\nwant:\n%s", got, want)
	}
	req.Proxy.EgressCheck = nil
	body = updated(t, f, inst, req)
	restartWith(t, g, body, pre, "-ec")
	if got, want := deletes("without the check"), "DELETE "+cloudinit.GuestAttributeURL; got != want {
		t.Errorf("a boot without the check ran:\n%s\nwant:\n%s", got, want)
	}
	for p := range g.Files() {
		if strings.Contains(p, "egress-check") {
			t.Errorf("%s stays on the guest after the check was turned off", p)
		}
	}
}

// TestReplacedCredentialsLeaveNoOldCopy: after an update that changes the
// password and the TLS key, neither the instance's metadata (the first
// boot's user-data staged both) nor the guest after the restart keeps the
// old htpasswd or key.
func TestReplacedCredentialsLeaveNoOldCopy(t *testing.T) {
	f := newFixture(t)
	req := request("pt-replaced", "0c8f6a1e-4444-4e2a-9c3f-00000000000f")
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: "first-password"}
	tlsOf := func() *proxy.TLS {
		tls, err := squid.LoadTLS(testenv.NewCerts(t, "proxy.example").Secret(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tls
	}
	req.Proxy.TLS = tlsOf()
	inst, body := created(t, f, req)
	oldHash := metadataItem(body, gcp.MetadataHtpasswd)
	oldKeyLine := strings.Split(metadataItem(body, gcp.MetadataTLSKey), "\n")[1]
	g := guesttest.New(t)
	g.Boot(metadataItem(body, gcp.MetadataUserData))
	if got, _ := g.ReadFile(cloudinit.HtpasswdPath); got != oldHash || oldHash == "" {
		t.Fatal("the first boot did not install the htpasswd")
	}

	req.Proxy.Auth.Password = "second-password"
	req.Proxy.TLS = tlsOf()
	body = updated(t, f, inst, req)
	for k, v := range metadataItems(body) {
		for _, old := range []string{oldHash, oldKeyLine} {
			if strings.Contains(v, old) || strings.Contains(v, base64.StdEncoding.EncodeToString([]byte(old))) {
				t.Errorf("metadata %s still holds a replaced credential", k)
			}
		}
	}
	restart(t, g, body)
	if got, _ := g.ReadFile(cloudinit.HtpasswdPath); got != metadataItem(body, gcp.MetadataHtpasswd) {
		t.Error("the startup script did not install the new htpasswd")
	}
	for p, content := range g.Files() {
		if strings.Contains(content, oldHash) || strings.Contains(content, oldKeyLine) {
			t.Errorf("%s on the guest still holds a replaced credential", p)
		}
	}
}

// TestStartupScriptBesideTheFirstBoot: on an image with Squid installed
// the startup script may run at the first boot between cloud-init's
// write_files and its runcmd; it then leaves the credentials cloud-init
// staged, which runcmd installs from.
func TestStartupScriptBesideTheFirstBoot(t *testing.T) {
	f := newFixture(t)
	req := request("pt-first-boot", "0c8f6a1e-4444-4e2a-9c3f-000000000010")
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: "a-password"}
	_, body := created(t, f, req)
	hash := metadataItem(body, gcp.MetadataHtpasswd)
	g := guesttest.New(t)
	staged := cloudinit.HtpasswdFiles()[1]
	g.WriteFile(staged, hash)
	restart(t, g, body)
	if got, _ := g.ReadFile(staged); got != hash {
		t.Error("the startup script removed the htpasswd cloud-init staged before cloud-init installed it")
	}
	g.Boot(metadataItem(body, gcp.MetadataUserData))
	restart(t, g, body)
	if _, ok := g.ReadFile(staged); ok {
		t.Error("the staged htpasswd stays after cloud-init ran and the VM restarted")
	}
}
