package cloudinit

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kdomanski/iso9660"
	yaml11 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit/guesttest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

func render(t *testing.T, auth bool) squid.Files {
	t.Helper()
	s := proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{443}}
	if auth {
		s.Auth = proxy.Auth{Enabled: true, Username: "proxy", Password: "SENTINEL-pw-0123456789abcdef"}
	}
	f, err := squid.Render(s, SquidOptions("uid-1"))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// parts splits MIME user-data into content type and body.
func parts(t *testing.T, ud string) [][2]string {
	t.Helper()
	header, body, _ := strings.Cut(ud, "\n\n")
	ct := strings.TrimPrefix(strings.SplitN(header, "\n", 2)[0], "Content-Type: ")
	_, params, err := mime.ParseMediaType(ct)
	if err != nil {
		t.Fatalf("Content-Type %q: %v", ct, err)
	}
	r := multipart.NewReader(strings.NewReader(body), params["boundary"])
	var out [][2]string
	for {
		p, err := r.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(p)
		out = append(out, [2]string{strings.Split(p.Header.Get("Content-Type"), ";")[0], string(b)})
	}
	return out
}

func TestUserData(t *testing.T) {
	cases := map[string]struct {
		user      string
		agent     bool
		auth      bool
		wantTypes []string
		wantIn    []string
		wantNotIn []string
	}{
		"GeneratedOnly": {"", false, false, []string{"text/cloud-config"},
			[]string{"squid.conf", "egp_restart squid", "> " + OwnAddressesPath}, []string{"qemu-guest-agent", "path: " + stageDir + "/htpasswd", stageDir + "/htpasswd " + HtpasswdPath, "egp_auth_helper;"}},
		"WithAgentAndAuth": {"", true, true, []string{"text/cloud-config"},
			[]string{"egp_install qemu-guest-agent", HtpasswdPath, "egp_auth_helper;", `-g \"$(egp_squid_group)\"`}, nil},
		"UserCloudConfigFirst": {"#cloud-config\ntimezone: Europe/Prague\n", false, false, []string{"text/cloud-config", "text/cloud-config"}, nil, nil},
		"UserScript":           {"#!/bin/sh\necho hi\n", false, false, []string{"text/x-shellscript", "text/cloud-config"}, nil, nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ud, err := UserData(Options{Squid: render(t, tc.auth), InstallGuestAgent: tc.agent, UserData: tc.user, Hostname: "p-1"})
			if err != nil {
				t.Fatal(err)
			}
			ps := parts(t, ud)
			if len(ps) != len(tc.wantTypes) {
				t.Fatalf("%d parts, want %d", len(ps), len(tc.wantTypes))
			}
			for i, p := range ps {
				if p[0] != tc.wantTypes[i] {
					t.Errorf("part %d is %s, want %s", i, p[0], tc.wantTypes[i])
				}
			}
			gen := ps[len(ps)-1][1]
			if tc.user != "" && ps[0][1] != tc.user {
				t.Errorf("the user's part changed:\n%s", ps[0][1])
			}
			// The generated part is valid YAML with the keys cloud-init reads.
			var cfg map[string]any
			if err := yaml.Unmarshal([]byte(gen), &cfg); err != nil {
				t.Fatalf("generated cloud-config is not YAML: %v\n%s", err, gen)
			}
			for _, k := range []string{"write_files", "runcmd", "merge_how"} {
				if _, ok := cfg[k]; !ok {
					t.Errorf("generated cloud-config has no %s", k)
				}
			}
			for _, w := range tc.wantIn {
				if !strings.Contains(gen, w) {
					t.Errorf("generated part does not mention %q", w)
				}
			}
			for _, w := range tc.wantNotIn {
				if strings.Contains(gen, w) {
					t.Errorf("generated part mentions %q", w)
				}
			}
			if strings.Contains(ud, "SENTINEL-pw") {
				t.Error("the password appears in clear in the user-data")
			}
		})
	}
}

// TestUserDataFormsTheChecksCannotSee: every form of user-data cloud-init
// accepts either reaches the cloud-config checks or is refused, naming
// the field and what is accepted, without quoting it.
func TestUserDataFormsTheChecksCannotSee(t *testing.T) {
	hidden := "#cloud-config\nmerge_how: [{name: dict, settings: [no_replace]}]\nwrite_files: [{path: /etc/squid/squid.conf, content: SENTINEL}]\n"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(hidden))
	_ = zw.Close()
	refused := map[string]struct{ user, want string }{
		"jinja cloud-config":         {"## template: jinja\n" + hidden, "a jinja template of anything but a #! script"},
		"jinja, other spelling":      {"##Template:JINJA\n" + hidden, "a jinja template of anything but a #! script"},
		"jinja of an include":        {"## template: jinja\n#include\nhttp://example.com/SENTINEL\n", "a jinja template of anything but a #! script"},
		"include":                    {"#include\nhttps://example.com/SENTINEL.cfg\n", "#include is fetched by the VM"},
		"include-once":               {"#include-once\nhttps://example.com/SENTINEL.cfg\n", "#include is fetched by the VM"},
		"part handler":               {"#part-handler\n# SENTINEL\ndef list_types(): return []\n", "#part-handler"},
		"gzip":                       {gz.String(), "gzip-compressed"},
		"MIME multipart":             {"Content-Type: multipart/mixed; boundary=\"b\"\nMIME-Version: 1.0\n\n--b\nContent-Type: text/cloud-config\n\n" + hidden + "--b--\n", "MIME user-data"},
		"MIME single part":           {"MIME-Version: 1.0\nContent-Type: text/cloud-config\n\n" + hidden, "MIME user-data"},
		"MIME x-include-url":         {"Content-Type: text/x-include-url\n\nhttps://example.com/SENTINEL\n", "MIME user-data"},
		"MIME part-handler":          {"Content-Type: text/part-handler\n\nSENTINEL\n", "MIME user-data"},
		"MIME jinja":                 {"Content-Type: text/jinja2\n\n" + hidden, "MIME user-data"},
		"cloud-config archive":       {"#cloud-config-archive\n- type: text/cloud-config\n  content: SENTINEL\n", "#cloud-config-archive"},
		"cloud-config jsonp":         {"#cloud-config-jsonp\n[{op: add, path: /SENTINEL}]\n", "#cloud-config-jsonp"},
		"cloud-config with a suffix": {"#cloud-configSENTINEL\nruncmd: []\n", "exactly #cloud-config"},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			_, err := UserData(Options{Squid: render(t, false), UserData: tc.user})
			if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "spec.forProvider.cloudInit") || !strings.Contains(err.Error(), "accepted are") {
				t.Fatalf("err = %v, want a Permanent error naming the field, saying %q and what is accepted", err, tc.want)
			}
			if strings.Contains(err.Error(), "SENTINEL") {
				t.Errorf("the error quotes the cloudInit: %v", err)
			}
		})
	}
	// What stays accepted, each as its own part type.
	for user, ct := range map[string]string{
		"#cloud-config\npackages: [curl]\n":                     "text/cloud-config",
		"#cloud-config   \npackages: [curl]\n":                  "text/cloud-config",
		"#!/bin/sh\necho hi\n":                                  "text/x-shellscript",
		"#cloud-boothook\necho hi\n":                            "text/cloud-boothook",
		"## template: jinja\n#!/bin/sh\necho {{ v1.region }}\n": "text/jinja2",
	} {
		ud, err := UserData(Options{Squid: render(t, false), UserData: user})
		if err != nil {
			t.Errorf("%q: %v", user, err)
			continue
		}
		if !strings.Contains(ud, "Content-Type: "+ct) {
			t.Errorf("%q: no %s part in\n%s", user, ct, ud)
		}
	}
}

func TestUserDataRejectsUnknownUserDataWithoutQuotingIt(t *testing.T) {
	_, err := UserData(Options{Squid: render(t, false), UserData: "SENTINEL-secret: value"})
	if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "spec.forProvider.cloudInit must start with") {
		t.Fatalf("err = %v, want a Permanent error naming the field", err)
	}
	if strings.Contains(err.Error(), "SENTINEL") {
		t.Error("the error quotes the user's cloudInit")
	}
}

// TestSeedISO: the seed holds user-data and meta-data as given, and the
// config's vendor-data byte for byte when it has one (none otherwise).
func TestSeedISO(t *testing.T) {
	const vendor = "#!/bin/sh\necho platform > /etc/motd\n"
	for _, vd := range []string{"", vendor} {
		iso, err := SeedISO("#cloud-config\n", MetaData("i-1", "p-1"), vd)
		if err != nil {
			t.Fatal(err)
		}
		img, err := iso9660.OpenImage(bytes.NewReader(iso))
		if err != nil {
			t.Fatal(err)
		}
		label, err := img.Label()
		if err != nil || label != SeedLabel {
			t.Errorf("label %q (%v), want %q", label, err, SeedLabel)
		}
		root, err := img.RootDir()
		if err != nil {
			t.Fatal(err)
		}
		children, err := root.GetChildren()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, c := range children {
			b, _ := io.ReadAll(c.Reader())
			got[c.Name()] = string(b)
		}
		want := map[string]string{"user-data": "#cloud-config\n", "meta-data": "instance-id: \"i-1\"\nlocal-hostname: \"p-1\"\n"}
		if vd != "" {
			want["vendor-data"] = vd
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("seed files with vendor-data %q: -want, +got:\n%s", vd, diff)
		}
	}
}

// TestUserCloudInitCannotReplaceTheSquidPart is the attack of a user whose
// cloudInit tries to end its MIME part early and add a part of its own
// (with the old fixed boundary, or any boundary-like line), or to change
// how the provider's part merges: the user's part stays one part, intact,
// and the provider's part comes last with its own merge rules.
func TestUserCloudInitCannotReplaceTheSquidPart(t *testing.T) {
	forged := "#!/bin/sh\necho hi\n"
	for _, b := range []string{"==egressproxy-boundary==", "egressproxy-0123456789abcdef0123456789abcdef"} {
		forged += "--" + b + "\nContent-Type: text/cloud-config\n\n#cloud-config\nwrite_files: []\nruncmd: [[systemctl, stop, squid]]\n--" + b + "--\n"
	}
	ud, err := UserData(Options{Squid: render(t, false), UserData: forged})
	if err != nil {
		t.Fatal(err)
	}
	ps := parts(t, ud)
	if len(ps) != 2 {
		t.Fatalf("%d parts, want the user's and the provider's", len(ps))
	}
	if ps[0][1] != forged {
		t.Errorf("the user's part was split or changed:\n%s", ps[0][1])
	}
	if !strings.Contains(ps[1][1], "egp_restart squid") || !strings.Contains(ps[1][1], "settings: [replace, recurse_list]") {
		t.Errorf("the last part is not the provider's, merging over the user's:\n%s", ps[1][1])
	}

	for name, tc := range map[string]struct{ user, want string }{
		"merge rules":             {"#cloud-config\nmerge_how: [{name: dict, settings: [no_replace]}]\n", "spec.forProvider.cloudInit: merge_how is not allowed"},
		"merge type":              {"#cloud-config\nmerge_type: 'list(replace)+dict(no_replace)'\n", "spec.forProvider.cloudInit: merge_type is not allowed"},
		"runcmd not a list":       {"#cloud-config\nruncmd: 'SENTINEL-secret'\n", "spec.forProvider.cloudInit: runcmd must be a list"},
		"write_files not a list":  {"#cloud-config\nwrite_files: {a: SENTINEL-secret}\n", "spec.forProvider.cloudInit: write_files must be a list"},
		"squid.conf overwritten":  {"#cloud-config\nwrite_files: [{path: /etc/squid/squid.conf, content: SENTINEL-secret, defer: true}]\n", "write_files[0] writes under /etc/squid"},
		"staged file overwritten": {"#cloud-config\nwrite_files: [{path: /var/lib/x/../egressproxy/squid.conf, content: SENTINEL-secret}]\n", "write_files[0] writes under /var/lib/egressproxy"},
		"not a mapping":           {"#cloud-config\n- SENTINEL-secret\n", "is not a YAML mapping"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := UserData(Options{Squid: render(t, false), UserData: tc.user})
			if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a Permanent error saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "SENTINEL") {
				t.Errorf("the error quotes the cloudInit: %v", err)
			}
		})
	}
}

func TestBoundaryIsNeverInTheContent(t *testing.T) {
	c := "#cloud-config\n"
	for range 50 {
		b := boundary(c, "generated")
		if strings.Contains(c, b) {
			t.Fatalf("boundary %q is in the content", b)
		}
		c += "--" + b + "\n" // the next content holds the last boundary
	}
}

// TestGuestFunctionsPerFamily runs GuestFunctions with sh against each
// guest family's tools, faked in a folder that is the whole PATH: each
// fake records how it was called.
func TestGuestFunctionsPerFamily(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		tools []string // commands the family has
		group string   // the group getent knows
		want  []string // calls recorded, in order
	}{
		"debian":   {[]string{"apt-get", "systemctl"}, "proxy", []string{"apt-get update", "apt-get install -y --no-install-recommends squid qemu-guest-agent", "systemctl enable --now squid", "systemctl restart squid", "group proxy"}},
		"fedora":   {[]string{"dnf", "yum", "systemctl"}, "squid", []string{"dnf install -y squid qemu-guest-agent", "systemctl enable --now squid", "systemctl restart squid", "group squid"}},
		"centos7":  {[]string{"yum", "systemctl"}, "squid", []string{"yum install -y squid qemu-guest-agent", "systemctl enable --now squid", "systemctl restart squid", "group squid"}},
		"opensuse": {[]string{"zypper", "systemctl"}, "squid", []string{"zypper --non-interactive install squid qemu-guest-agent", "systemctl enable --now squid", "systemctl restart squid", "group squid"}},
		"alpine":   {[]string{"apk", "rc-update", "rc-service"}, "squid", []string{"apk add --no-cache squid qemu-guest-agent", "rc-update add squid default", "rc-service squid start", "rc-service squid restart", "group squid"}},
		"unknown":  {nil, "squid", []string{"egressproxy: no apt-get, dnf, yum, zypper or apk to install squid qemu-guest-agent"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			bin := t.TempDir()
			log := filepath.Join(t.TempDir(), "calls")
			fake := func(name, body string) {
				if err := os.WriteFile(filepath.Join(bin, name), []byte("#!"+sh+"\n"+body+"\n"), 0o755); err != nil { //nolint:gosec // A fake command.
					t.Fatal(err)
				}
			}
			for _, tool := range tc.tools {
				fake(tool, `echo "`+tool+` $*" >> `+log)
			}
			// getent knows only the family's group.
			fake("getent", `[ "$2" = "`+tc.group+`" ]`)
			script := GuestFunctions + `; egp_install squid qemu-guest-agent 2>> ` + log + ` || exit 0; egp_enable squid; egp_restart squid; echo "group $(egp_squid_group)" >> ` + log
			cmd := exec.Command(sh, "-ec", script)
			cmd.Env = []string{"PATH=" + bin}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("the functions failed: %v\n%s", err, out)
			}
			b, _ := os.ReadFile(log)
			got := strings.Split(strings.TrimSpace(string(b)), "\n")
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("calls on %s (-want +got):\n%s", name, diff)
			}
		})
	}
}

func TestSquidConfOf(t *testing.T) {
	files, err := squid.Render(proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: proxy.Auth{Enabled: true, Username: "u", Password: "p"}}, SquidOptions("uid-1"))
	if err != nil {
		t.Fatal(err)
	}
	ud, err := UserData(Options{Squid: files, UserData: "#cloud-config\nwrite_files:\n  - path: /etc/motd\n    content: hi\n"})
	if err != nil {
		t.Fatal(err)
	}
	if got := SquidConfOf(ud); got != files.SquidConf {
		t.Errorf("SquidConfOf(user-data) = %q; want the rendered squid.conf", got)
	}
	if got := squid.IdentityOf(SquidConfOf(ud)); got != squid.Identity("uid-1") {
		t.Errorf("identity %q; want %q", got, squid.Identity("uid-1"))
	}
	if SquidConfOf("#cloud-config\n") != "" {
		t.Error("a squid.conf in user-data without one")
	}
}

// TestUserDataWithTLS: a proxy with TLS gets its certificate and key
// through write_files (base64, root only), installed next to squid.conf
// with the key readable by Squid's group alone, and a squid.conf that
// listens with https_port on them. The key is in no runcmd line (which
// cloud-init writes to its scripts and may log) and nowhere in clear.
func TestUserDataWithTLS(t *testing.T) {
	const keyLine = "MHcCAQEEIKEYSENTINELkeymaterial0123456789abcdefghijklmnopqrs"
	key := "-----BEGIN EC PRIVATE KEY-----\n" + keyLine + "\n-----END EC PRIVATE KEY-----\n"
	s := proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{443},
		Auth: proxy.Auth{Enabled: true, Username: "proxy", Password: "SENTINEL-pw-0123456789abcdef"},
		TLS:  &proxy.TLS{Cert: "-----BEGIN CERTIFICATE-----\nchain\n-----END CERTIFICATE-----\n", Key: key, CA: "ca"}}
	f, err := squid.Render(s, SquidOptions("uid-1"))
	if err != nil {
		t.Fatal(err)
	}
	ud, err := UserData(Options{Squid: f, Hostname: "p-1"})
	if err != nil {
		t.Fatal(err)
	}
	cert, gotKey := TLSOf(ud)
	if cert != s.TLS.Cert || gotKey != key {
		t.Errorf("TLSOf(user-data) = certificate %v, key %v; want both installed", cert == s.TLS.Cert, gotKey == key)
	}
	if conf := SquidConfOf(ud); !strings.Contains(conf, "https_port 3128 tls-cert="+TLSCertPath+" tls-key="+TLSKeyPath+"\n") {
		t.Errorf("squid.conf does not listen with TLS on the installed files:\n%s", conf)
	}
	gen := parts(t, ud)[0][1]
	var cfg struct {
		WriteFiles []struct{ Path, Permissions string } `json:"write_files"`
		Runcmd     [][]string                           `json:"runcmd"`
	}
	if err := yaml.Unmarshal([]byte(gen), &cfg); err != nil {
		t.Fatal(err)
	}
	staged := map[string]string{}
	for _, w := range cfg.WriteFiles {
		staged[w.Path] = w.Permissions
	}
	if staged[stageDir+"/tls.key"] != "0600" || staged[stageDir+"/tls.crt"] != "0600" {
		t.Errorf("staged files %v; want tls.crt and tls.key, root only", staged)
	}
	script := fmt.Sprint(cfg.Runcmd)
	for _, w := range []string{"chmod 0700 " + stageDir, "install -m 0644 -o root -g root " + stageDir + "/tls.crt " + TLSCertPath,
		`install -m 0640 -o root -g "$(egp_squid_group)" ` + stageDir + "/tls.key " + TLSKeyPath} {
		if !strings.Contains(script, w) {
			t.Errorf("runcmd does not %q:\n%s", w, script)
		}
	}
	if strings.Contains(script, "KEYSENTINEL") || strings.Contains(script, base64.StdEncoding.EncodeToString([]byte(key))) {
		t.Errorf("runcmd holds the key")
	}
	if strings.Contains(ud, keyLine) {
		t.Errorf("the key appears in clear in the user-data")
	}
}

// TestUserDataEgressReport: the guest's own egress check is written with
// its request (root only), a script that is valid bash and names the
// port, a systemd service and hourly timer started after Squid; the GCP
// form also puts the line to the guest attribute. The request reads back
// (EgressRequestOf) for the fakes' guests.
func TestUserDataEgressReport(t *testing.T) {
	const req = "GET http://echo.example/ip HTTP/1.1\r\nProxy-Authorization: Basic U0VOVElORUw=\r\n\r\n"
	for _, attr := range []bool{false, true} {
		ud, err := UserData(Options{Squid: render(t, false), EgressReport: &EgressReport{Request: req, Port: 3129, GuestAttribute: attr}})
		if err != nil {
			t.Fatal(err)
		}
		if got := EgressRequestOf(ud); got != req {
			t.Errorf("EgressRequestOf = %q; want %q", got, req)
		}
		var cfg struct {
			WriteFiles []struct{ Path, Permissions, Content string } `json:"write_files"`
			Runcmd     [][]string                                    `json:"runcmd"`
		}
		gen := parts(t, ud)[0][1]
		if err := yaml.Unmarshal([]byte(gen), &cfg); err != nil {
			t.Fatal(err)
		}
		files := map[string]string{}
		for _, f := range cfg.WriteFiles {
			files[f.Path] = f.Permissions
			if f.Path != reportScriptPath {
				continue
			}
			script := decode(t, f.Content)
			if !strings.Contains(script, "check "+reportRequestPath+" 3129 127.0.0.1") || !strings.Contains(script, squid.ReportScript) || !strings.Contains(script, ReportPath) {
				t.Errorf("script does not run squid.ReportScript on port 3129 into %s:\n%s", ReportPath, script)
			}
			if strings.Contains(script, "guest-attributes/"+GuestAttributeKey) != attr {
				t.Errorf("guest attribute %v, script:\n%s", attr, script)
			}
			if out, err := exec.Command("bash", "-n", "-c", script).CombinedOutput(); err != nil {
				t.Errorf("the script is not valid bash: %v: %s", err, out)
			}
		}
		want := map[string]string{reportRequestPath: "0600", reportScriptPath: "0755",
			"/etc/systemd/system/egressproxy-egress-check.service": "0644", "/etc/systemd/system/egressproxy-egress-check.timer": "0644",
			openRCStagedPath: "0644"}
		for p, mode := range want {
			if files[p] != mode {
				t.Errorf("%s written with mode %q; want %q", p, files[p], mode)
			}
		}
		run := strings.Join(cfg.Runcmd[len(cfg.Runcmd)-1], " ")
		if i, j := strings.Index(run, "egp_restart squid"), strings.Index(run, "enable --now egressproxy-egress-check.timer"); i < 0 || j < i {
			t.Errorf("runcmd does not start the timer after Squid:\n%s", run)
		}
		if strings.Contains(ud, "SENTINEL") || strings.Contains(ud, "U0VOVElORUw=") {
			t.Error("the check's request is in clear in the user-data")
		}
	}
	// Without a check the seed writes none of its files, and stops and
	// removes what an earlier run of the seed (Proxmox) left.
	ud, _ := UserData(Options{Squid: render(t, false)})
	if EgressRequestOf(ud) != "" {
		t.Error("user-data without a report holds a check's request")
	}
	g := guesttest.New(t)
	for _, f := range EgressCheckFiles(&EgressReport{Request: "GET http://echo.example/ HTTP/1.1\r\n\r\n", Port: 3129}) {
		g.WriteFile(f.Path, f.Content)
	}
	g.WriteFile(ReportPath, "egressproxy-egress-check 1700000000 200 203.0.113.7\n")
	g.Boot(ud)
	for p := range g.Files() {
		if strings.Contains(p, "egress-check") {
			t.Errorf("%s stays on a guest whose seed has no check", p)
		}
	}
}

func decode(t *testing.T, b64 string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestNamesStayStrings: cloud-init reads YAML 1.1, where a name a user
// may set as the external name (yes, null, 017, 0x1f) is a bool, null or
// number, and the guest would get no hostname; the generated cloud-config
// and meta-data give every name as a string, and MetaValue reads back
// what MetaData wrote and what earlier versions wrote bare.
func TestNamesStayStrings(t *testing.T) {
	for _, name := range []string{"yes", "no", "on", "off", "null", "true", "017", "0x1f", "0b101", "12345", "p-1"} {
		t.Run(name, func(t *testing.T) {
			ps := parts(t, must(UserData(Options{Squid: render(t, false), Hostname: name})))
			var cfg map[string]any
			if err := yaml11.Unmarshal([]byte(ps[len(ps)-1][1]), &cfg); err != nil {
				t.Fatal(err)
			}
			if got, ok := cfg["hostname"].(string); !ok || got != name {
				t.Errorf("user-data hostname %#v, want the string %q", cfg["hostname"], name)
			}
			md := MetaData(name, name)
			var meta map[string]any
			if err := yaml11.Unmarshal([]byte(md), &meta); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"instance-id", "local-hostname"} {
				if got, ok := meta[k].(string); !ok || got != name {
					t.Errorf("meta-data %s %#v, want the string %q", k, meta[k], name)
				}
			}
			for _, line := range strings.Split(strings.TrimSpace(md), "\n") {
				_, v, _ := strings.Cut(line, ": ")
				if MetaValue(v) != name {
					t.Errorf("MetaValue(%q) = %q, want %q", v, MetaValue(v), name)
				}
			}
			if MetaValue(name) != name {
				t.Errorf("MetaValue of a bare %q = %q", name, MetaValue(name))
			}
		})
	}
}

func must(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}
