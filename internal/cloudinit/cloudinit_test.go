package cloudinit

import (
	"bytes"
	"io"
	"mime"
	"mime/multipart"
	"strings"
	"testing"

	"github.com/kdomanski/iso9660"
	"sigs.k8s.io/yaml"

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
			[]string{"squid.conf", "systemctl restart squid"}, []string{"qemu-guest-agent", "htpasswd"}},
		"WithAgentAndAuth": {"", true, true, []string{"text/cloud-config"},
			[]string{"qemu-guest-agent", HtpasswdPath, "-g proxy"}, nil},
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

func TestUserDataRejectsUnknownUserDataWithoutQuotingIt(t *testing.T) {
	_, err := UserData(Options{Squid: render(t, false), UserData: "SENTINEL-secret: value"})
	if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "spec.forProvider.cloudInit must start with") {
		t.Fatalf("err = %v, want a Permanent error naming the field", err)
	}
	if strings.Contains(err.Error(), "SENTINEL") {
		t.Error("the error quotes the user's cloudInit")
	}
}

func TestSeedISO(t *testing.T) {
	iso, err := SeedISO("#cloud-config\n", MetaData("i-1", "p-1"))
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
	if got["user-data"] != "#cloud-config\n" || got["meta-data"] != "instance-id: i-1\nlocal-hostname: p-1\n" {
		t.Errorf("seed files = %q", got)
	}
}
