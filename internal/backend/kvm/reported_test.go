package kvm

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestReportedAddressIsGuarded: a tenant's host (a namespaced config)
// reports its VM's address as one of the provider's own network: a cloud
// metadata address a guest cannot have, or one of the cluster's Service
// network. The readiness probe refuses it, saying it is the address the
// host reported, and never asks there; the proxy is not Ready. The same
// address on a platform config's host is probed.
func TestReportedAddressIsGuarded(t *testing.T) {
	// 10.96.0.0/12 stands for the discovered Service network. The image
	// is on a public mirror, reached through a forward proxy (the image
	// server): a tenant's download never connects to loopback.
	tenant := netguard.New(netguard.Options{Denied: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}, ContentAllowed: []netip.Prefix{mirrorRange}})
	for _, reported := range []string{"168.63.129.16", "100.100.100.200", "10.96.0.1", "10.96.0.10"} {
		for _, guard := range []*netguard.Guard{tenant, nil} {
			name := fmt.Sprintf("tenant=%v/%s", guard != nil, reported)
			t.Run(name, func(t *testing.T) {
				e := newTestEnv(t, func(e *testEnv) {
					e.cfg.Guard = guard
					e.cfg.Images["debian"] = Image{URL: mirrorURL, SHA256: e.images.sha()}
				})
				e.throughProxy(e.images.Listener.Addr().String())
				var asked atomic.Int32
				e.b.prober = &squid.Prober{Wait: time.Minute, PositiveTTL: time.Nanosecond, NegativeTTL: time.Nanosecond,
					Ask: func(ctx context.Context, addr string) (string, error) {
						asked.Add(1)
						return e.host.squidAsk(ctx, addr)
					}}
				e.host.nextAgentIP = reported
				inst := e.mustCreate(e.request("web", "6f1c2a7e-3b4d-4c5e-9f60-718293a4b5c6"))
				if err := e.settle(context.Background(), inst.ID); err != nil {
					t.Fatal(err)
				}
				got := e.mustGet(ref(inst))
				if guard == nil {
					if !got.ProxyReachable || asked.Load() == 0 {
						t.Errorf("platform host: %+v, asked %d times; want the proxy probed and reachable", got, asked.Load())
					}
					return
				}
				if got.ProxyReachable || got.ProxyAddress != "" || !strings.Contains(got.Progress, "the backend reports the proxy's address as "+reported+":3128") || !strings.Contains(got.Progress, "does not connect to "+reported) {
					t.Errorf("tenant host: ProxyReachable %v, ProxyAddress %q, Progress %q; want refused, naming the reported address", got.ProxyReachable, got.ProxyAddress, got.Progress)
				}
				if n := asked.Load(); n != 0 {
					t.Errorf("the refused address was asked %d times; want 0", n)
				}
			})
		}
	}
}

// TestTenantHostCheckDoesNotQuoteIt: a tenant's libvirtd names itself
// with a sentinel; its config's health does not show it (the numbers of
// its version, pool and memory stay), a platform config's does.
func TestTenantHostCheckDoesNotQuoteIt(t *testing.T) {
	const sentinel = "SENTINEL-host-5d1f"
	for _, guard := range []*netguard.Guard{onlyAllowing(t, "0.0.0.0/0"), nil} {
		e := newTestEnv(t, func(e *testEnv) { e.cfg.Guard = guard })
		e.host.hostname = sentinel
		th := e.d.Check(context.Background()).Targets[0]
		quoted := strings.Contains(fmt.Sprintf("%+v", th), sentinel)
		if guard != nil && (quoted || th.Details["libvirtVersion"] == "") {
			t.Errorf("tenant host's health = %+v; want no hostname, the version's numbers", th)
		}
		if guard == nil && !quoted {
			t.Errorf("platform host's health = %+v; want its hostname", th)
		}
	}
}

// kexServer answers every connection as an SSH server whose key exchange
// offers only algorithms named name: the client's handshake error quotes
// them.
func kexServer(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var payload []byte
	payload = append(payload, 20) // SSH_MSG_KEXINIT
	payload = append(payload, make([]byte, 16)...)
	for range 10 {
		payload = binary.BigEndian.AppendUint32(payload, uint32(len(name)))
		payload = append(payload, name...)
	}
	payload = append(payload, 0, 0, 0, 0, 0)
	pad := 8 - (len(payload)+5)%8
	if pad < 4 {
		pad += 8
	}
	packet := binary.BigEndian.AppendUint32(nil, uint32(len(payload)+pad+1))
	packet = append(packet, byte(pad))
	packet = append(packet, payload...)
	packet = append(packet, make([]byte, pad)...)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				_, _ = c.Write(append([]byte("SSH-2.0-OpenSSH_9.6\r\n"), packet...))
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestTenantSSHServerIsNotQuoted: an SSH server at a tenant's host
// address offers key exchange algorithms named with a sentinel, which
// the SSH library quotes when the handshake fails. The health of a
// namespaced config (the guarded dial) does not hold it; a platform
// config's does. Names holding the phrase of an authentication refusal
// ("ssh: unable to authenticate") do not make the failure one: Unauthorized
// is decided by what the client saw, not by the error's text.
func TestTenantSSHServerIsNotQuoted(t *testing.T) {
	const sentinel = "SENTINEL-kex-a11c"
	b := NewBackend(Options{})
	t.Cleanup(b.Close)
	key, _ := sshMaterialForTest(t)
	for _, name := range []string{sentinel, "ssh: unable to authenticate " + sentinel, "ssh: unable to authenticate, attempted methods [none publickey], no supported methods remain " + sentinel} {
		addr := kexServer(t, name)
		for _, guard := range []*netguard.Guard{onlyAllowing(t, "127.0.0.0/8"), nil} {
			d := b.Driver(Config{Name: testProvider, Guard: guard, Credentials: Credentials{Key: key, InsecureIgnoreHostKey: true},
				Hosts: []Host{{Name: "h", Address: addr, User: "proxy"}}})
			th := d.Check(context.Background()).Targets[0]
			quoted := strings.Contains(fmt.Sprintf("%+v", th), sentinel)
			t.Logf("name %q, guard %v: %s: %s", name, guard != nil, th.Reason, th.Message)
			if th.Healthy || (guard != nil) == quoted {
				t.Errorf("name %q, guard %v: Check = %+v; want unhealthy, quoting the server only for the platform's config", name, guard != nil, th)
			}
			if th.Reason == proxy.ReasonUnauthorized {
				t.Errorf("name %q, guard %v: Check = %+v; a key exchange that failed is not an authentication refusal", name, guard != nil, th)
			}
		}
	}
}

// TestTenantSSHAuthRefusalIsAFixedText: a host whose version and banner
// carry the phrase of an authentication refusal and a sentinel, and which
// refuses the key. Both configs see Unauthorized; a namespaced config's
// health says only that the host refused the key; neither quotes the
// sentinel.
func TestTenantSSHAuthRefusalIsAFixedText(t *testing.T) {
	const sentinel = "SENTINEL-banner-3e7d"
	addr := refusingSSHServer(t, "ssh: unable to authenticate "+sentinel)
	b := NewBackend(Options{})
	t.Cleanup(b.Close)
	key, _ := sshMaterialForTest(t)
	for _, guard := range []*netguard.Guard{onlyAllowing(t, "127.0.0.0/8"), nil} {
		d := b.Driver(Config{Name: testProvider, Guard: guard, Credentials: Credentials{Key: key, InsecureIgnoreHostKey: true},
			Hosts: []Host{{Name: "h", Address: addr, User: "proxy"}}})
		th := d.Check(context.Background()).Targets[0]
		t.Logf("guard %v: %s: %s", guard != nil, th.Reason, th.Message)
		if th.Healthy || th.Reason != proxy.ReasonUnauthorized || strings.Contains(fmt.Sprintf("%+v", th), sentinel) {
			t.Errorf("guard %v: Check = %+v; want Unauthorized, without the sentinel", guard != nil, th)
		}
		if want := "the host refused the key"; (guard != nil) != strings.Contains(th.Message, want) {
			t.Errorf("guard %v: message %q; want %q only for the namespaced config", guard != nil, th.Message, want)
		}
		if guard == nil && !strings.Contains(th.Message, "unable to authenticate, attempted methods") {
			t.Errorf("platform config: message %q; want the SSH library's error", th.Message)
		}
	}
}

// refusingSSHServer is an SSH server that names itself and greets with
// say, then refuses every key.
func refusingSSHServer(t *testing.T, say string) string {
	t.Helper()
	_, hk, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(hk)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{
		ServerVersion:  "SSH-2.0-" + strings.ReplaceAll(say, " ", "_"),
		BannerCallback: func(ssh.ConnMetadata) string { return say },
		PublicKeyCallback: func(ssh.ConnMetadata, ssh.PublicKey) (*ssh.Permissions, error) {
			return nil, fmt.Errorf("%s", say)
		},
	}
	cfg.AddHostKey(signer)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if sc, _, _, err := ssh.NewServerConn(c, cfg); err == nil {
					_ = sc.Close()
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func sshMaterialForTest(t *testing.T) ([]byte, ssh.Signer) {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(k, "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block), s
}
