package kvm

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/digitalocean/go-libvirt/libvirttest"
	"golang.org/x/crypto/ssh"
)

// sshServer is an in-process SSH server on loopback that accepts one
// client key and forwards direct-streamlocal channels for one socket path
// to go-libvirt's mock libvirtd.
type sshServer struct {
	addr       string
	hostKey    ssh.Signer
	socket     string
	authorized map[string]bool // marshalled public keys
	// silent makes the server ignore keepalive requests.
	silent atomic.Bool
	conns  atomic.Int32
	mu     sync.Mutex
	ln     net.Listener
	open   []net.Conn
}

func newSSHServer(t *testing.T) *sshServer {
	t.Helper()
	_, hk, _ := ed25519.GenerateKey(rand.Reader)
	signer, err := ssh.NewSignerFromKey(hk)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sshServer{addr: ln.Addr().String(), hostKey: signer, socket: DefaultSocket, authorized: map[string]bool{}, ln: ln}
	go s.serve()
	t.Cleanup(s.close)
	return s
}

func (s *sshServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.open {
		_ = c.Close()
	}
}

// dropAll closes every client connection (the host went away).
func (s *sshServer) dropAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.open {
		_ = c.Close()
	}
	s.open = nil
}

// newClientKey returns an OpenSSH private key; authorized when asked.
func (s *sshServer) newClientKey(t *testing.T, authorize bool) []byte {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	b, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if authorize {
		sp, _ := ssh.NewPublicKey(pub)
		s.mu.Lock()
		s.authorized[string(sp.Marshal())] = true
		s.mu.Unlock()
	}
	return pem.EncodeToMemory(b)
}

// knownHosts is a known_hosts line for the server's key.
func (s *sshServer) knownHosts() []byte {
	return []byte(knownHostsLine(s.addr, s.hostKey.PublicKey()) + "\n")
}

func knownHostsLine(addr string, k ssh.PublicKey) string {
	host, port, _ := net.SplitHostPort(addr)
	return "[" + host + "]:" + port + " " + string(ssh.MarshalAuthorizedKey(k)[:len(ssh.MarshalAuthorizedKey(k))-1])
}

func (s *sshServer) serve() {
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.authorized[string(k.Marshal())] {
			return nil, nil
		}
		return nil, io.ErrUnexpectedEOF
	}}
	cfg.AddHostKey(s.hostKey)
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.open = append(s.open, c)
		s.mu.Unlock()
		go s.handle(c, cfg)
	}
}

func (s *sshServer) handle(c net.Conn, cfg *ssh.ServerConfig) {
	sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		_ = c.Close()
		return
	}
	s.conns.Add(1)
	defer func() { _ = sc.Close() }()
	go func() {
		for r := range reqs {
			if s.silent.Load() {
				continue // never answered
			}
			if r.WantReply {
				_ = r.Reply(r.Type == "keepalive@openssh.com", nil)
			}
		}
	}()
	for nc := range chans {
		if nc.ChannelType() != "direct-streamlocal@openssh.com" {
			_ = nc.Reject(ssh.UnknownChannelType, "only streamlocal")
			continue
		}
		var payload struct {
			Path      string
			Reserved0 string
			Reserved1 uint32
		}
		if err := ssh.Unmarshal(nc.ExtraData(), &payload); err != nil || payload.Path != s.socket {
			_ = nc.Reject(ssh.ConnectionFailed, "connect failed: No such file or directory")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go ssh.DiscardRequests(creqs)
		mock := libvirttest.New()
		mc, _ := mock.Dial()
		go func() { _, _ = io.Copy(mc, ch); _ = mc.Close() }()
		go func() { _, _ = io.Copy(ch, mc); _ = ch.Close() }()
	}
}
