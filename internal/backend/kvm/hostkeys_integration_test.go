package kvm_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// multiKeySSHD is a real sshd on a loopback port of its own with an
// ed25519, an RSA and an ECDSA host key, letting the test user in with the
// test key and forwarding to libvirtd's socket like hack/libvirt-up.sh's.
type multiKeySSHD struct {
	addr string
	// pub are the host's public keys by type.
	pub map[string]ssh.PublicKey
}

// openToAll lets everyone enter dir, a t.TempDir(), and the parent that
// testing made for it (both 0700); never the folders above, which are the
// machine's (TMPDIR, /tmp with its sticky bit).
func openToAll(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil { //nolint:gosec // a test's folder, to be entered.
			t.Fatal(err)
		}
	}
}

func startMultiKeySSHD(t *testing.T, h *kvmtest.Host) *multiKeySSHD {
	t.Helper()
	sshd, err := exec.LookPath("/usr/sbin/sshd")
	if err != nil {
		kvmtest.Unavailable(t, "sshd", err)
	}
	dir := t.TempDir()
	// sshd reads authorized_keys as the user.
	openToAll(t, dir)
	s := &multiKeySSHD{pub: map[string]ssh.PublicKey{}}
	var hostKeys []string
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 3072)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for name, k := range map[string]any{"ed25519": edKey, "rsa": rsaKey, "ecdsa": ecKey} {
		block, err := ssh.MarshalPrivateKey(k, "")
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "ssh_host_"+name+"_key")
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		hostKeys = append(hostKeys, "HostKey "+path)
		signer, err := ssh.ParsePrivateKey(pem.EncodeToMemory(block))
		if err != nil {
			t.Fatal(err)
		}
		s.pub[name] = signer.PublicKey()
	}
	client, err := ssh.ParsePrivateKey(h.Key)
	if err != nil {
		t.Fatal(err)
	}
	authorized := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(authorized, ssh.MarshalAuthorizedKey(client.PublicKey()), 0o644); err != nil { //nolint:gosec // sshd reads it as the user.
		t.Fatal(err)
	}
	// A free loopback port: listen, note it, close, hand it to sshd.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	_ = ln.Close()
	_, port, _ := net.SplitHostPort(s.addr)
	cfg := filepath.Join(dir, "sshd_config")
	conf := strings.Join(append([]string{
		"Port " + port,
		"ListenAddress 127.0.0.1",
		"PidFile " + filepath.Join(dir, "sshd.pid"),
		"AuthorizedKeysFile " + authorized,
		"StrictModes no", "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
		"PubkeyAuthentication yes", "PermitRootLogin no", "AllowUsers " + h.Values["SSH_USER"],
		"AllowTcpForwarding local", "AllowStreamLocalForwarding local", "X11Forwarding no",
	}, hostKeys...), "\n") + "\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	var log testenv.Buffer
	cmd := exec.Command(sshd, "-D", "-e", "-f", cfg)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		kvmtest.Unavailable(t, "a dedicated sshd", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sshd log:\n%s", log.String())
		}
	})
	testenv.WaitFor(t, "the dedicated sshd to listen on "+s.addr, 10*time.Second, func() (bool, string) {
		c, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err != nil {
			return false, err.Error() + "; sshd: " + log.String()
		}
		_ = c.Close()
		return true, ""
	})
	return s
}

// knownHost is a known_hosts line for the sshd's key of type name.
func (s *multiKeySSHD) knownHost(name string) []byte {
	_, port, _ := net.SplitHostPort(s.addr)
	return []byte(fmt.Sprintf("[127.0.0.1]:%s %s", port, ssh.MarshalAuthorizedKey(s.pub[name])))
}

// TestIntegrationSSHHostKeys: a known_hosts holding only one of a host's
// several key types (only ed25519, only RSA, only ECDSA) verifies the host,
// through the real sshd and on to the real libvirtd; a known_hosts holding
// another key of the host's types does not.
func TestIntegrationSSHHostKeys(t *testing.T) {
	h := kvmtest.Up(t)
	s := startMultiKeySSHD(t, h)
	host := h.KVMHost("multikey")
	host.Address = s.addr

	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	otherSigner, _ := ssh.NewSignerFromKey(otherKey)
	_, port, _ := net.SplitHostPort(s.addr)
	impostor := []byte(fmt.Sprintf("[127.0.0.1]:%s %s", port, ssh.MarshalAuthorizedKey(otherSigner.PublicKey())))

	cases := []struct {
		name       string
		knownHosts []byte
		healthy    bool
	}{
		{"OnlyEd25519", s.knownHost("ed25519"), true},
		{"OnlyRSA", s.knownHost("rsa"), true},
		{"OnlyECDSA", s.knownHost("ecdsa"), true},
		{"AllThree", append(append(s.knownHost("ed25519"), s.knownHost("rsa")...), s.knownHost("ecdsa")...), true},
		{"AnotherEd25519Key", impostor, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := kvm.NewBackend(kvm.Options{})
			t.Cleanup(b.Close)
			d := b.Driver(kvm.Config{
				Name:         "ClusterProviderConfig hostkeys",
				Credentials:  kvm.Credentials{Key: h.Key, KnownHosts: tc.knownHosts},
				DiskSizeGB:   1,
				MachineTypes: map[string]kvm.MachineType{"tiny": {VCPUs: 1, MemoryMiB: 256}},
				Hosts:        []kvm.Host{host},
			})
			th := d.Check(context.Background()).Targets[0]
			switch {
			case tc.healthy && !th.Healthy:
				t.Errorf("Check with known_hosts %q: %s: %s; want healthy", strings.TrimSpace(string(tc.knownHosts)), th.Reason, th.Message)
			case !tc.healthy && th.Healthy:
				t.Errorf("Check with a known_hosts naming another key is healthy; want the host refused")
			case !tc.healthy && !strings.Contains(th.Message, "key"):
				t.Errorf("Check with a known_hosts naming another key: %s: %s; want a message about the host key", th.Reason, th.Message)
			}
		})
	}
}
