package kvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"github.com/skeema/knownhosts"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/crypto/ssh"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Credentials are the SSH material of one config, read from its Secrets on
// every Connect. Never logged, never in errors or spans.
type Credentials struct {
	// Key is the private key (OpenSSH or PEM).
	Key []byte
	// KnownHosts is an OpenSSH known_hosts file.
	KnownHosts []byte
	// InsecureIgnoreHostKey turns host key verification off.
	InsecureIgnoreHostKey bool
	// KeyField and KnownHostsField name where the material came from, for
	// error messages.
	KeyField, KnownHostsField string
}

// digest identifies the material without revealing it: the pool key.
func (c Credentials) digest() string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:", len(c.Key))
	h.Write(c.Key)
	fmt.Fprintf(h, "%d:", len(c.KnownHosts))
	h.Write(c.KnownHosts)
	fmt.Fprintf(h, "%t", c.InsecureIgnoreHostKey)
	return hex.EncodeToString(h.Sum(nil))
}

// clientConfig builds the SSH client config for the host at addr
// (host:port). Parse failures never quote the parser's message: it can
// hold a fragment of the material.
func (c Credentials) clientConfig(user, addr string) (*ssh.ClientConfig, error) {
	if len(c.Key) == 0 {
		return nil, fmt.Errorf("%w: %s is empty", errCredentials, orDefault(c.KeyField, "the SSH key"))
	}
	signer, err := ssh.ParsePrivateKey(c.Key)
	if err != nil {
		var missing *ssh.PassphraseMissingError
		if errors.As(err, &missing) {
			return nil, proxy.Permanentf("%s holds a passphrase-protected key; the provider needs one without a passphrase", orDefault(c.KeyField, "the SSH key"))
		}
		return nil, proxy.Permanentf("%s does not parse as an SSH private key (OpenSSH or PEM)", orDefault(c.KeyField, "the SSH key"))
	}
	cfg := &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}}
	switch {
	case c.InsecureIgnoreHostKey:
		cfg.HostKeyCallback = ssh.InsecureIgnoreHostKey() //nolint:gosec // Asked for explicitly; the config's Secure condition says so.
	case len(c.KnownHosts) == 0:
		return nil, fmt.Errorf("%w: %s is not set or empty (required unless insecureIgnoreHostKey)", errCredentials, orDefault(c.KnownHostsField, "known_hosts"))
	default:
		db, err := knownHostsDB(c.KnownHosts)
		if err != nil {
			return nil, proxy.Permanentf("%s does not parse as a known_hosts file", orDefault(c.KnownHostsField, "known_hosts"))
		}
		cfg.HostKeyCallback = db.HostKeyCallback()
		// Ask only for the key types known_hosts holds for this host: a host
		// with several keys otherwise offers its preferred one (say
		// ed25519), which fails against a known_hosts holding only its RSA
		// key. Unknown hosts get none, and the callback refuses them.
		cfg.HostKeyAlgorithms = db.HostKeyAlgorithms(addr)
	}
	return cfg, nil
}

// knownHostsDB parses known_hosts content. knownhosts reads files only,
// so the content goes through a private temporary file removed at once.
func knownHostsDB(content []byte) (*knownhosts.HostKeyDB, error) {
	f, err := os.CreateTemp("", "kvm-known-hosts-*")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	if _, err := f.Write(content); err != nil {
		_ = f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return knownhosts.NewDB(f.Name())
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// dialStage says how far a dial got, for Check's reasons.
type dialStage string

const (
	stageCredentials dialStage = "credentials"
	stageTCP         dialStage = "tcp"
	stageSSH         dialStage = "ssh"
	stageSocket      dialStage = "socket"
	stageLibvirt     dialStage = "libvirt"
)

// dialError is a failed dial and the stage it failed at.
type dialError struct {
	stage dialStage
	err   error
}

func (e *dialError) Error() string { return fmt.Sprintf("%s: %v", e.stage, e.err) }
func (e *dialError) Unwrap() error { return e.err }

// quiet is err without what a tenant's host said (t.Guard set): the
// handshake's errors quote the server's algorithm lists and disconnect
// message, a refused channel the server's reason, libvirtd its message.
// A host-key refusal (knownhosts' own words) and an authentication refusal
// (recorded by authWatch, shown as a fixed text) say nothing of the
// server's and stay as they are.
func (t Target) quiet(err error) error {
	if t.Guard == nil || isSSHAuth(err) {
		return err
	}
	return netguard.Quiet(err, "kvm.hosts[].address")
}

// authWatch follows one handshake from the client's side: whether the
// host key was accepted, and which methods the client tried and the host
// refused. It decides whether a failed handshake is an authentication
// refusal; what the host sends never does.
type authWatch struct {
	mu       sync.Mutex
	accepted bool
	tried    []string
}

// watch hooks w into cfg: the host key callback records an accepted key,
// the auth callback the methods tried so far (it picks nothing itself: the
// methods of cfg.Auth follow as without it).
func (w *authWatch) watch(cfg *ssh.ClientConfig) {
	check := cfg.HostKeyCallback
	cfg.HostKeyCallback = func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		if err := check(hostname, remote, key); err != nil {
			return err
		}
		w.mu.Lock()
		w.accepted = true
		w.mu.Unlock()
		return nil
	}
	cfg.AuthCallback = func(ac *ssh.ClientAuthContext) (ssh.AuthMethod, error) {
		w.mu.Lock()
		w.tried = slices.Clone(ac.TriedMethods)
		w.mu.Unlock()
		return nil, nil
	}
}

// refused reports whether err, from ssh.NewClientConn, is the host
// refusing every method: the host key was accepted, the client tried its
// methods, and err is exactly the error x/crypto/ssh (v0.55.0,
// client.go and client_auth.go) builds from the methods it tried, which
// holds nothing the host sent. A host quoting that phrase (in algorithm
// names, a disconnect message) does not make an error of that shape.
func (w *authWatch) refused(err error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil || !w.accepted || len(w.tried) == 0 {
		return false
	}
	return err.Error() == fmt.Sprintf("ssh: handshake failed: ssh: unable to authenticate, attempted methods %v, no supported methods remain", w.tried)
}

// sshDialer is the production dialer: TCP, SSH handshake, a
// direct-streamlocal channel to libvirtd's socket, go-libvirt on top.
type sshDialer struct {
	budgets Budgets
	tracer  trace.Tracer
	netDial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// dial connects to t's host. The whole sequence is bounded by the dial
// budget; the result is one link with keepalive.
func (d *sshDialer) dial(ctx context.Context, t Target) (c *conn, err error) {
	ctx, span := d.tracer.Start(ctx, spanDial, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(append(telemetry.ServerAttributes(t.Host.Address),
		attribute.String(attrHost, t.Host.Name), attribute.String("kvm.user", t.Host.User))...))
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	ctx, cancel := context.WithTimeout(ctx, d.budgets.Dial)
	defer cancel()

	cfg, err := t.Creds.clientConfig(t.Host.User, t.Host.Address)
	if err != nil {
		return nil, &dialError{stageCredentials, err}
	}
	var watch authWatch
	watch.watch(cfg)
	netDial := d.netDial
	switch {
	case t.Guard != nil:
		// A tenant's host: never the provider's own network.
		netDial = t.Guard.DialContext
	case netDial == nil:
		netDial = (&net.Dialer{}).DialContext
	}
	tcp, err := netDial(ctx, "tcp", t.Host.Address)
	if err != nil {
		return nil, &dialError{stageTCP, err}
	}
	// The handshake takes no ctx: bound it with a deadline and by closing
	// the connection when ctx ends.
	if dl, ok := ctx.Deadline(); ok {
		_ = tcp.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = tcp.Close() })
	sc, chans, reqs, err := ssh.NewClientConn(tcp, t.Host.Address, cfg)
	if err != nil {
		stop()
		_ = tcp.Close()
		switch {
		case ctx.Err() != nil && t.Guard != nil:
			// netguard.Quiet lets a deadline through as it is: the
			// handshake's error, which can quote the host, is left out.
			err = fmt.Errorf("%w during the SSH handshake", ctx.Err())
		case ctx.Err() != nil:
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		case watch.refused(err):
			err = &authRefusedError{err: err, quiet: t.Guard != nil}
		}
		return nil, &dialError{stageSSH, t.quiet(err)}
	}
	client := ssh.NewClient(sc, chans, reqs)
	sock, err := client.DialContext(ctx, "unix", t.Host.socket())
	if err != nil {
		stop()
		_ = client.Close()
		return nil, &dialError{stageSocket, t.quiet(err)}
	}
	// streamOrder: go-libvirt misreads a download whose data comes first.
	order := newStreamOrder(sock)
	l := libvirt.NewWithDialer(dialers.NewAlreadyConnected(order))
	connected := make(chan error, 1)
	go func() { connected <- l.ConnectToURI(libvirt.QEMUSystem) }()
	select {
	case err = <-connected:
	case <-ctx.Done():
		err = ctx.Err()
	}
	stop()
	if err != nil {
		_ = sock.Close()
		_ = client.Close()
		return nil, &dialError{stageLibvirt, t.quiet(err)}
	}
	_ = tcp.SetDeadline(time.Time{})

	lk := newLink(func() error {
		_ = sock.Close()
		return client.Close()
	}, d.budgets.Linger)
	go keepalive(client, lk, d.budgets.Keepalive)
	go func() {
		select {
		case <-l.Disconnected():
			reason := "libvirt disconnected"
			if err := order.failure(); err != nil {
				reason = err.Error()
			}
			lk.close(reason)
		case <-lk.done:
		}
	}()
	go func() {
		// The SSH transport ending (host gone, sshd restarted) ends the link.
		_ = client.Wait()
		lk.close("ssh connection ended")
	}()
	return &conn{api: &adapter{l: l, link: lk, budgets: d.budgets, quiet: t.Guard != nil}, link: lk}, nil
}

// keepalive sends keepalive@openssh.com every interval; an unanswered one
// closes the link, so the next call redials instead of hanging.
func keepalive(c *ssh.Client, lk *link, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-lk.done:
			return
		case <-t.C:
		}
		answered := make(chan error, 1)
		go func() {
			_, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
			answered <- err
		}()
		select {
		case err := <-answered:
			if err != nil {
				lk.close("keepalive failed: " + err.Error())
				return
			}
		case <-time.After(interval):
			lk.close("keepalive unanswered")
			return
		case <-lk.done:
			return
		}
	}
}
