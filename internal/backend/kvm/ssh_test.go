package kvm

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/crypto/ssh"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// sshEnv is a Backend with the production SSH dialer against an
// in-process SSH server.
type sshEnv struct {
	srv  *sshServer
	b    *Backend
	logs *testenv.Buffer
	host Host
	key  []byte
}

func newSSHEnv(t *testing.T, budgets Budgets) *sshEnv {
	t.Helper()
	e := &sshEnv{srv: newSSHServer(t), logs: &testenv.Buffer{}}
	log := funcr.New(func(prefix, args string) { e.logs.Line(prefix + " " + args) }, funcr.Options{Verbosity: 2})
	e.b = NewBackend(Options{Budgets: budgets, Log: &log, Tracer: noop.NewTracerProvider().Tracer("")})
	t.Cleanup(e.b.Close)
	e.host = Host{Name: "lab", Address: e.srv.addr, User: "proxy", Bridge: "br0"}
	e.key = e.srv.newClientKey(t, true)
	return e
}

func (e *sshEnv) creds() Credentials {
	return Credentials{Key: e.key, KnownHosts: e.srv.knownHosts(), KeyField: "spec.kvm.credentials.sshKeySecretRef", KnownHostsField: "spec.kvm.credentials.knownHostsSecretRef"}
}

// call dials (or reuses) the pooled connection for c and h and makes one
// call go-libvirt's mock libvirtd answers; errors as the driver returns
// them.
func (e *sshEnv) call(c Credentials, h Host) error {
	ctx := context.Background()
	d := e.b.Driver(Config{Name: testProvider, Credentials: c, Hosts: []Host{h}})
	api, err := d.conn(ctx, h)
	if err == nil {
		_, err = api.ConnectGetLibVersion(ctx)
	}
	return d.wrap(err, proxy.OpList)
}

func TestSSH_dialReachesLibvirtThroughTheSocket(t *testing.T) {
	e := newSSHEnv(t, Budgets{})
	api, err := e.b.pool.get(context.Background(), Target{Host: e.host, Creds: e.creds()})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	v, err := api.ConnectGetLibVersion(context.Background())
	if err != nil || v == 0 {
		t.Fatalf("ConnectGetLibVersion over SSH = %d, %v", v, err)
	}
	// The same credentials share the pooled connection.
	again, _ := e.b.pool.get(context.Background(), Target{Host: e.host, Creds: e.creds()})
	if again != api || e.srv.conns.Load() != 1 {
		t.Errorf("a second get dialled again (%d SSH connections)", e.srv.conns.Load())
	}
}

// TestSSH_failuresAreClassifiedAtTheSource drives every dial stage to
// fail with what x/crypto/ssh and the server really produce.
func TestSSH_failuresAreClassifiedAtTheSource(t *testing.T) {
	e := newSSHEnv(t, Budgets{Dial: 2 * time.Second})
	_, otherHostKey, _ := ed25519.GenerateKey(rand.Reader)
	otherSigner, _ := ssh.NewSignerFromKey(otherHostKey)
	const sentinel = "S3NT1NEL-in-a-bad-key-77"
	cases := []struct {
		name   string
		creds  func(c Credentials) Credentials
		host   func(h Host) Host
		class  proxy.Class
		reason string
		want   string
	}{
		{"Works", nil, nil, "", ReasonReachable, ""},
		{"KeyNotAuthorized", func(c Credentials) Credentials { c.Key = e.srv.newClientKey(t, false); return c }, nil,
			proxy.ClassPermanent, proxy.ReasonUnauthorized, "unable to authenticate"},
		{"HostKeyChanged", func(c Credentials) Credentials {
			c.KnownHosts = []byte(knownHostsLine(e.srv.addr, otherSigner.PublicKey()) + "\n")
			return c
		}, nil, proxy.ClassPermanent, proxy.ReasonUnauthorized, "key mismatch"},
		{"HostKeyUnknown", func(c Credentials) Credentials {
			c.KnownHosts = []byte(knownHostsLine("192.0.2.1:22", otherSigner.PublicKey()) + "\n")
			return c
		}, nil, proxy.ClassPermanent, proxy.ReasonUnauthorized, "key is unknown"},
		{"InsecureIgnoresHostKey", func(c Credentials) Credentials {
			c.KnownHosts, c.InsecureIgnoreHostKey = nil, true
			return c
		}, nil, "", ReasonReachable, ""},
		{"KeyDoesNotParse", func(c Credentials) Credentials {
			c.Key = []byte("-----BEGIN OPENSSH PRIVATE KEY-----\n" + sentinel + "\n-----END OPENSSH PRIVATE KEY-----\n")
			return c
		}, nil, proxy.ClassPermanent, proxy.ReasonCredentialsUnavailable, "sshKeySecretRef does not parse as an SSH private key"},
		{"KnownHostsDoNotParse", func(c Credentials) Credentials { c.KnownHosts = []byte("@bogus " + sentinel + "\n"); return c }, nil,
			proxy.ClassPermanent, proxy.ReasonCredentialsUnavailable, "knownHostsSecretRef does not parse as a known_hosts file"},
		{"NothingListens", nil, func(h Host) Host { h.Address = "127.0.0.1:1"; return h },
			proxy.ClassTransient, proxy.ReasonUnreachable, "connection refused"},
		{"SocketMissing", nil, func(h Host) Host { h.Socket = "/run/nothing.sock"; return h },
			proxy.ClassTransient, proxy.ReasonUnreachable, "No such file or directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, h := e.creds(), e.host
			if tc.creds != nil {
				c = tc.creds(c)
			}
			if tc.host != nil {
				h = tc.host(h)
			}
			err := e.call(c, h)
			if tc.class == "" {
				if err != nil {
					t.Fatalf("call = %v", err)
				}
				return
			}
			// Check fails at the same stage, on a connection of its own.
			d := e.b.Driver(Config{Name: testProvider, Credentials: c, Hosts: []Host{h}})
			health := d.Check(context.Background())
			th := health.Targets[0]
			if proxy.ClassOf(err) != tc.class || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("List = %v (%s); want %s containing %q", err, proxy.ClassOf(err), tc.class, tc.want)
			}
			var pe *proxy.Error
			if !errors.As(err, &pe) || pe.Provider != testProvider || pe.Op != proxy.OpList {
				t.Errorf("error %v lacks provider or op", err)
			}
			if th.Healthy || th.Reason != tc.reason {
				t.Errorf("Check = %+v; want reason %s", th, tc.reason)
			}
			for _, s := range []string{err.Error(), fmt.Sprintf("%+v", health), e.logs.String()} {
				for _, secret := range []string{sentinel, string(e.key), strings.TrimSpace(string(e.srv.knownHosts()))} {
					if strings.Contains(s, secret) {
						t.Fatalf("key material leaked: %q", s)
					}
				}
			}
		})
	}
}

// TestSSH_rotatedSecretTakesEffectOnNextDial: new credentials dial a new
// connection; the one built from the old ones is retired and closed.
func TestSSH_rotatedSecretTakesEffectOnNextDial(t *testing.T) {
	e := newSSHEnv(t, Budgets{})
	old := e.creds()
	if err := e.call(old, e.host); err != nil {
		t.Fatal(err)
	}
	oldConn := e.b.pool.live(Target{Host: e.host, Creds: old}.key())
	rotated := old
	rotated.Key = e.srv.newClientKey(t, true)
	if err := e.call(rotated, e.host); err != nil {
		t.Fatal(err)
	}
	if n := e.srv.conns.Load(); n != 2 {
		t.Errorf("%d SSH connections; want a second one for the rotated key", n)
	}
	select {
	case <-oldConn.link.done:
	case <-time.After(2 * time.Second):
		t.Error("the connection built from the old key was not closed")
	}
	// A key that is no longer authorized fails on the next dial.
	revoked := old
	revoked.Key = e.srv.newClientKey(t, false)
	if err := e.call(revoked, e.host); !proxy.IsPermanent(err) {
		t.Errorf("List with an unauthorized key = %v; want Permanent", err)
	}
}

// TestSSH_keepaliveFailureDropsTheConnection: a host that stops answering
// keepalives is dropped, and the next call redials.
func TestSSH_keepaliveFailureDropsTheConnection(t *testing.T) {
	e := newSSHEnv(t, Budgets{Keepalive: 100 * time.Millisecond})
	if err := e.call(e.creds(), e.host); err != nil {
		t.Fatal(err)
	}
	c := e.b.pool.live(Target{Host: e.host, Creds: e.creds()}.key())
	e.srv.silent.Store(true)
	select {
	case <-c.link.done:
	case <-time.After(3 * time.Second):
		t.Fatal("the connection stayed up without keepalive answers")
	}
	if r := c.link.closeReason(); !strings.Contains(r, "keepalive") {
		t.Errorf("closed because %q", r)
	}
	e.srv.silent.Store(false)
	if err := e.call(e.creds(), e.host); err != nil {
		t.Fatalf("call after the drop: %v", err)
	}
	if n := e.srv.conns.Load(); n != 2 {
		t.Errorf("%d SSH connections; want a redial", n)
	}
}

// TestSSH_hostGoneFailsCallsOnceThenRedials.
func TestSSH_hostGoneFailsCallsOnceThenRedials(t *testing.T) {
	e := newSSHEnv(t, Budgets{})
	if err := e.call(e.creds(), e.host); err != nil {
		t.Fatal(err)
	}
	e.srv.dropAll()
	time.Sleep(100 * time.Millisecond)
	if err := e.call(e.creds(), e.host); err != nil {
		t.Fatalf("call after the host dropped the connection: %v", err)
	}
}

// TestSSH_hungCallIsAbandonedWithinItsBudget: the mock libvirtd never
// answers ConnectGetHostname. The call returns Transient at its budget;
// the link is retired, not killed, and the next call dials afresh.
func TestSSH_hungCallIsAbandonedWithinItsBudget(t *testing.T) {
	e := newSSHEnv(t, Budgets{RPC: 300 * time.Millisecond, Linger: time.Minute})
	ctx := context.Background()
	tgt := Target{Host: e.host, Creds: e.creds()}
	api, err := e.b.pool.get(ctx, tgt)
	if err != nil {
		t.Fatal(err)
	}
	first := e.b.pool.live(tgt.key())
	start := time.Now()
	_, err = api.ConnectGetHostname(ctx)
	if took := time.Since(start); !proxy.IsTransient(err) || took > 2*time.Second {
		t.Fatalf("hung call = %v after %v; want Transient at the budget", err, took)
	}
	if first.link.usable() {
		t.Error("the link that abandoned a call still takes new calls")
	}
	select {
	case <-first.link.done:
	case <-time.After(2 * time.Second):
		t.Error("the retired link was not closed once only the abandoned call remained")
	}
	api2, err := e.b.pool.get(ctx, tgt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api2.ConnectGetLibVersion(ctx); err != nil {
		t.Fatalf("a call after the abandonment: %v", err)
	}
}

// TestAuthWatch_refusedOnlyOnTheClientsOwnRecord: an authentication
// refusal needs the host key accepted, the methods tried, and x/crypto's
// error built from exactly those methods. The phrase elsewhere, as a host
// can send it (a disconnect message, algorithm names), never counts.
func TestAuthWatch_refusedOnlyOnTheClientsOwnRecord(t *testing.T) {
	const exact = "ssh: handshake failed: ssh: unable to authenticate, attempted methods [none publickey], no supported methods remain"
	cases := []struct {
		name     string
		accepted bool
		tried    []string
		err      error
		want     bool
	}{
		{"Refused", true, []string{"none", "publickey"}, errors.New(exact), true},
		{"RefusedNoneOnly", true, []string{"none"}, errors.New("ssh: handshake failed: ssh: unable to authenticate, attempted methods [none], no supported methods remain"), true},
		{"HostKeyNotAccepted", false, []string{"none", "publickey"}, errors.New(exact), false},
		{"AuthNotReached", true, nil, errors.New(exact), false},
		{"OtherMethods", true, []string{"none"}, errors.New(exact), false},
		{"Disconnect", true, []string{"none", "publickey"}, errors.New("ssh: handshake failed: ssh: disconnect, reason 2: " + exact), false},
		{"Suffix", true, []string{"none", "publickey"}, errors.New(exact + " SENTINEL"), false},
		{"Algorithms", true, nil, errors.New(`ssh: handshake failed: ssh: no common algorithm for key exchange; we offered: ["curve25519-sha256"], peer offered: ["ssh: unable to authenticate SENTINEL"]`), false},
		{"Nil", true, []string{"none", "publickey"}, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := &authWatch{accepted: tc.accepted, tried: tc.tried}
			if got := w.refused(tc.err); got != tc.want {
				t.Errorf("refused(%v) with accepted %v, tried %v = %v; want %v", tc.err, tc.accepted, tc.tried, got, tc.want)
			}
		})
	}
}
