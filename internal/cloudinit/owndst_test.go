package cloudinit_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit/guesttest"
)

// TestOwnAddressesBeforeEveryStart: the first boot lists the guest's own
// addresses and its default gateways as the ACL squid.conf includes (so Squid does not start
// without them) and has systemd list them again before every start of
// Squid; a seed run again (a Proxmox update) lists the addresses the guest
// has then, not those of its first boot.
func TestOwnAddressesBeforeEveryStart(t *testing.T) {
	g := guesttest.New(t)
	ud, f := userData(t, false, false)
	g.Boot(ud)
	want := "acl own_dst dst 10.0.0.1\nacl own_dst dst 10.0.0.5\nacl own_dst dst 127.0.0.1\nacl own_dst dst ::1\n"
	if got, _ := g.ReadFile(cloudinit.OwnAddressesPath); got != want {
		t.Errorf("%s after the first boot:\n%s\nwant:\n%s", cloudinit.OwnAddressesPath, got, want)
	}
	for p := range g.Files() {
		if strings.HasPrefix(p, cloudinit.OwnAddressesPath+".") {
			t.Errorf("%s stays on the guest", p)
		}
	}
	if !strings.Contains(f.SquidConf, "\ninclude "+cloudinit.OwnAddressesPath+"\n") {
		t.Errorf("squid.conf does not include %s:\n%s", cloudinit.OwnAddressesPath, f.SquidConf)
	}
	files := cloudinit.OwnAddressesFiles()
	for _, gf := range files {
		if got, _ := g.ReadFile(gf.Path); got != gf.Content {
			t.Errorf("%s after the first boot:\n%s\nwant:\n%s", gf.Path, got, gf.Content)
		}
	}
	if !strings.Contains(files[0].Content, cloudinit.RefreshOwnAddresses) || !strings.Contains(files[1].Content, "\nExecStartPre="+files[0].Path+"\n") {
		t.Errorf("systemd does not list the addresses before Squid starts:\n%s\n%s", files[0].Content, files[1].Content)
	}

	t.Run("SquidReadsThem", func(t *testing.T) {
		bin := squidBinary(t)
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o755); err != nil { //nolint:gosec // Squid drops to its own user.
			t.Fatal(err)
		}
		own, _ := g.ReadFile(cloudinit.OwnAddressesPath)
		conf, _ := g.ReadFile(cloudinit.SquidConfPath)
		for name, content := range map[string]string{"own.conf": own, "squid.conf": strings.ReplaceAll(conf, cloudinit.OwnAddressesPath, filepath.Join(dir, "own.conf"))} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil { //nolint:gosec // Squid's to read.
				t.Fatal(err)
			}
		}
		if out, err := exec.Command(bin, "-k", "parse", "-f", filepath.Join(dir, "squid.conf")).CombinedOutput(); err != nil {
			t.Errorf("squid -k parse of the guest's squid.conf and addresses: %v\n%s", err, out)
		}
	})

	// A new lease and an IPv6 address; an IPv4 gateway reached over IPv6
	// and IPv6 multipath, as iproute2 prints them.
	g.Tool("ip", `case "$*" in "-o addr show") echo "1: lo    inet 127.0.0.1/8 scope host lo"; `+
		`echo "2: ens4    inet 10.0.0.9/24 brd 10.0.0.255 scope global dynamic ens4"; echo "2: ens4    inet6 2001:db8::9/64 scope global dynamic mngtmpaddr";; `+
		`"route show default") echo "default via inet6 fe80::1 dev ens4 proto static"; echo "default dev wg0 scope link";; `+
		`"-6 route show default") echo "default proto ra metric 1024 expires 1797sec pref medium"; `+
		`printf '\tnexthop via fe80::2 dev ens4 weight 1\n\tnexthop via 2001:db8::1 dev ens5 weight 1\n';; *) exit 1;; esac`)
	g.Boot(ud)
	want = "acl own_dst dst 10.0.0.9\nacl own_dst dst 127.0.0.1\nacl own_dst dst 2001:db8::1\nacl own_dst dst 2001:db8::9\nacl own_dst dst ::1\n" +
		"acl own_dst dst fe80::1\nacl own_dst dst fe80::2\n"
	if got, _ := g.ReadFile(cloudinit.OwnAddressesPath); got != want {
		t.Errorf("%s after the seed ran again:\n%s\nwant:\n%s", cloudinit.OwnAddressesPath, got, want)
	}
}

// squidBinary is Debian's squid; without it the test skips, but under CI,
// where it must be installed (hack/install-squid.sh), it fails.
func squidBinary(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"squid", "/usr/sbin/squid"} {
		if bin, err := exec.LookPath(p); err == nil {
			return bin
		}
	}
	if ci := os.Getenv("CI"); ci != "" && ci != "false" && ci != "0" {
		t.Fatal("squid not found: run hack/install-squid.sh (CI is set, so this test does not skip)")
	}
	t.Skip("squid not found: run hack/install-squid.sh")
	return ""
}

// TestOwnAddressesWithoutIPFail: where ip cannot list the guest's
// addresses (missing, not on the PATH), the refresh fails and leaves the
// list as it was, rather than write one of loopback alone that would leave
// the guest's own addresses open.
func TestOwnAddressesWithoutIPFail(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "own.conf")
	const before = "acl own_dst dst 10.0.0.5\n"
	if err := os.WriteFile(list, []byte(before), 0o644); err != nil { //nolint:gosec // A test's file.
		t.Fatal(err)
	}
	bin := refreshTools(t)
	cmd := exec.Command("/bin/sh", "-ec", strings.ReplaceAll(cloudinit.RefreshOwnAddresses, cloudinit.OwnAddressesPath, list))
	cmd.Env = []string{"PATH=" + bin}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("the refresh without ip succeeded (%s)", out)
	}
	if b, _ := os.ReadFile(list); string(b) != before {
		t.Errorf("the list became %q; want it as it was", b)
	}
	if left, _ := filepath.Glob(list + ".*"); len(left) != 0 {
		t.Errorf("temporary files stay: %v", left)
	}
}

// TestOwnAddressesNeedIPv4Routes: an ip that lists addresses but not the
// IPv4 routes fails the refresh and leaves the list as it was (the
// gateways would be left open); one that cannot list IPv6 routes (a
// guest without IPv6) lists the rest.
func TestOwnAddressesNeedIPv4Routes(t *testing.T) {
	const before = "acl own_dst dst 10.0.0.5\n"
	for name, tc := range map[string]struct {
		ip      string
		ok      bool
		listing string
	}{
		"IPv4RoutesFail": {ip: `case "$*" in *route*) exit 2;; *) echo "2: ens4    inet 10.0.0.9/24 scope global ens4";; esac`, listing: before},
		"NoIPv6": {ip: `case "$*" in "-6 route show default") echo "RTNETLINK answers: Address family not supported by protocol" >&2; exit 2;; ` +
			`"route show default") echo "default via 10.0.0.1 dev ens4";; *) echo "2: ens4    inet 10.0.0.9/24 scope global ens4";; esac`,
			ok: true, listing: "acl own_dst dst 10.0.0.1\nacl own_dst dst 10.0.0.9\nacl own_dst dst 127.0.0.1\nacl own_dst dst ::1\n"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			list := filepath.Join(dir, "own.conf")
			if err := os.WriteFile(list, []byte(before), 0o644); err != nil { //nolint:gosec // A test's file.
				t.Fatal(err)
			}
			bin := refreshTools(t)
			if err := os.WriteFile(filepath.Join(bin, "ip"), []byte("#!/bin/sh\n"+tc.ip+"\n"), 0o755); err != nil { //nolint:gosec // The test's tool.
				t.Fatal(err)
			}
			cmd := exec.Command("/bin/sh", "-ec", strings.ReplaceAll(cloudinit.RefreshOwnAddresses, cloudinit.OwnAddressesPath, list))
			cmd.Env = []string{"PATH=" + bin, "LC_ALL=C"}
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.ok {
				t.Errorf("the refresh: %v (%s); want success %v", err, out, tc.ok)
			}
			if b, _ := os.ReadFile(list); string(b) != tc.listing {
				t.Errorf("the list is %q; want %q", b, tc.listing)
			}
			if left, _ := filepath.Glob(list + ".*"); len(left) != 0 {
				t.Errorf("temporary files stay: %v", left)
			}
		})
	}
}

// refreshTools is a PATH of the tools RefreshOwnAddresses runs but ip.
func refreshTools(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	for _, c := range []string{"sort", "awk", "chmod", "mv", "rm"} {
		p, err := exec.LookPath(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(bin, c)); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}
