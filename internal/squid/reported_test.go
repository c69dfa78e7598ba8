package squid_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

const sentinel = "SENTINEL-7f3a"

// counted is a loopback listener that counts the connections it accepts
// and answers each with answer (nil: as Squid named identity answers a
// probe).
func counted(t *testing.T, answer func(net.Conn)) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	n := &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			go func() {
				defer func() { _ = c.Close() }()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				_, _ = c.Read(buf)
				answer(c)
			}()
		}
	}()
	return ln.Addr().String(), n
}

func squidAnswer(identity string) func(net.Conn) {
	return func(c net.Conn) {
		_, _ = fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\nServer: squid\r\nX-Cache: MISS from %s\r\nConnection: close\r\n\r\n", identity)
	}
}

const uid = "6f1c2a7e-3b4d-4c5e-9f60-718293a4b5c6"

// TestProbeOfAReportedAddressIsGuarded: a tenant's backend reports its
// proxy at an address of the provider's own (loopback, metadata, in any
// spelling). With the config's guard the probe refuses it, saying it is
// the address the backend reported and why, and nothing connects there,
// neither the real Ask nor a fake's; with a guard that allows the range,
// or none (the platform's configs), the same Squid is found serving.
func TestProbeOfAReportedAddressIsGuarded(t *testing.T) {
	addr, n := counted(t, squidAnswer(squid.Identity(uid)))
	_, port, _ := net.SplitHostPort(addr)
	tenant := netguard.New(netguard.Options{})
	ctx := context.Background()

	var asked atomic.Int32
	fake := &squid.Prober{Wait: time.Minute, Ask: func(context.Context, string) (string, error) {
		asked.Add(1)
		return squid.Identity(uid), nil
	}}
	real := &squid.Prober{Wait: time.Minute, Timeout: 20 * time.Second}
	for _, reported := range []string{addr, "[::ffff:127.0.0.1]:" + port, "[64:ff9b::7f00:1]:" + port, "169.254.169.254:3128", "[fd00:ec2::254]:3128", "localhost:" + port} {
		for name, p := range map[string]*squid.Prober{"real": real, "fake": fake} {
			got := p.Check(ctx, tenant.Reported(), name+reported, reported, squid.Identity(uid), "")
			if got.Serving || !got.Refused || !strings.Contains(got.Message, "the backend reports the proxy's address as "+reported) || !strings.Contains(got.Message, "does not connect to") {
				t.Errorf("%s probe of %s = %+v; want refused, naming the address the backend reported", name, reported, got)
			}
		}
	}
	if c, a := n.Load(), asked.Load(); c != 0 || a != 0 {
		t.Fatalf("refused probes connected %d times and asked the fake %d times; want 0", c, a)
	}

	allowed := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if got := real.Check(ctx, allowed.Reported(), "allowed", addr, squid.Identity(uid), ""); !got.Serving {
		t.Errorf("probe with 127.0.0.0/8 allowed = %+v; want Serving", got)
	}
	var none *netguard.Guard
	if got := real.Check(ctx, none.Reported(), "platform", addr, squid.Identity(uid), ""); !got.Serving {
		t.Errorf("probe of the platform's config = %+v; want Serving", got)
	}
	if c := n.Load(); c != 2 {
		t.Errorf("the allowed probes connected %d times; want 2", c)
	}
}

// TestEgressCheckOfAReportedAddressIsGuarded: the egress check connects
// to the proxy at the address the backend reports; a refused one is never
// connected to, and the check's error says so.
func TestEgressCheckOfAReportedAddressIsGuarded(t *testing.T) {
	addr, n := counted(t, func(c net.Conn) { _, _ = fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n203.0.113.7") })
	check := proxy.EgressCheck{URL: "http://echo.example/ip", Username: squid.CheckUsername, Password: "sentinel-check-password"}
	c := &squid.EgressChecker{Wait: 20 * time.Second, Timeout: 15 * time.Second}
	got := c.Check(t.Context(), netguard.New(netguard.Options{}).Reported(), "uid", "i1", addr, check, time.Hour)
	if got.IP != "" || !strings.Contains(got.Error, "the backend reports the proxy's address as "+addr) {
		t.Errorf("egress check through a refused address = %+v; want an error naming it", got)
	}
	if k := n.Load(); k != 0 {
		t.Fatalf("the refused egress check connected %d times; want 0", k)
	}
	var none *netguard.Guard
	if got := c.Check(t.Context(), none.Reported(), "platform", "i1", addr, check, time.Hour); got.IP != "203.0.113.7" {
		t.Errorf("egress check of the platform's config = %+v; want the echo's address", got)
	}
}

// TestProbeAndEgressCheckDoNotQuoteAnswers: what answers at a proxy's
// address (a tenant's VM, or whatever the address it reported is) chooses
// the X-Cache name, the status text of an answer or of a refused CONNECT
// and the bytes of an answer that is not HTTP: none is quoted.
func TestProbeAndEgressCheckDoNotQuoteAnswers(t *testing.T) {
	ctx := context.Background()
	p := &squid.Prober{Wait: time.Minute, Timeout: 20 * time.Second}
	addr, _ := counted(t, squidAnswer(sentinel))
	if got := p.Check(ctx, nil, "k", addr, squid.Identity(uid), ""); got.Serving || strings.Contains(got.Message, sentinel) {
		t.Errorf("probe of a Squid named %s = %+v; want not Serving, not quoting the name", sentinel, got)
	}
	other := squid.Identity("0a0a0a0a-0000-4000-8000-000000000000")
	addr, _ = counted(t, squidAnswer(other))
	if got := p.Check(ctx, nil, "k2", addr, squid.Identity(uid), ""); got.Serving || !strings.Contains(got.Message, other) {
		t.Errorf("probe of another resource's Squid = %+v; want its name, one of the provider's", got)
	}

	tlsProbesDoNotQuoteTheCertificate(t, p)

	for name, answer := range map[string]string{
		"status text":      "HTTP/1.1 502 " + sentinel + "\r\nContent-Length: 0\r\n\r\n",
		"not HTTP":         "SSH-2.0-" + sentinel + "\r\n",
		"header":           "HTTP/1.1 200 OK\r\nX-" + sentinel + ": " + sentinel + "\r\nContent-Length: 7\r\n\r\n" + sentinel,
		"connect refused":  "HTTP/1.1 403 " + sentinel + "\r\nContent-Length: 0\r\n\r\n",
		"malformed status": "HTTP/1.1 " + sentinel + "\r\n\r\n",
	} {
		addr, _ := counted(t, func(c net.Conn) { _, _ = fmt.Fprint(c, answer) })
		for _, url := range []string{"http://echo.example/ip", "https://echo.example/ip"} {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := squid.AskEgress(cctx, nil, addr, proxy.EgressCheck{URL: url, Username: squid.CheckUsername, Password: "pw"})
			cancel()
			if err == nil || strings.Contains(err.Error(), sentinel) {
				t.Errorf("%s, %s: AskEgress = %v; want an error that does not quote the answer", name, url, err)
			}
		}
	}
}

// tlsProbesDoNotQuoteTheCertificate: a proxy listening with TLS whose
// certificate does not verify against the proxy's CA names whatever
// answers at the address (its subject, its names, its issuer: a host of
// the tenant's choosing in a range allowed for tenants). The probe of a
// tenant's reported address (a guard) says so in fixed words, quoting
// none of them; the platform's (no guard) names the certificate, for its
// operators. Nor is an answer that is not TLS quoted, or the certificate
// in the egress check's error.
func tlsProbesDoNotQuoteTheCertificate(t *testing.T, p *squid.Prober) {
	t.Helper()
	ctx := context.Background()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "vault." + sentinel + ".corp", Organization: []string{sentinel + " Inc"}},
		DNSNames:     []string{"vault." + sentinel + ".corp", "db-primary." + sentinel + ".corp"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go squid.AnswerProbes(ln, squid.Identity(uid))
	addr := ln.Addr().String()
	own := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	other := testenv.NewCerts(t, "proxy.example").CA
	tenant := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}).Reported()

	// The listener works: with its own certificate as the CA, Squid is found.
	if got := p.Check(ctx, tenant, "tls-own-ca", addr, squid.Identity(uid), own); !got.Serving {
		t.Fatalf("TLS probe with the certificate's own CA = %+v; want Serving", got)
	}
	got := p.Check(ctx, tenant, "tls-tenant", addr, squid.Identity(uid), other)
	t.Logf("%s: %s", "tls-tenant", got.Message)
	if got.Serving || strings.Contains(got.Message, sentinel) || !strings.Contains(got.Message, "does not verify against the proxy's CA") {
		t.Errorf("tenant's TLS probe of a certificate named %s = %+v; want not Serving, saying it does not verify, quoting none of it", sentinel, got)
	}
	got = p.Check(ctx, nil, "tls-platform", addr, squid.Identity(uid), other)
	t.Logf("%s: %s", "tls-platform", got.Message)
	if got.Serving || !strings.Contains(got.Message, sentinel) || !strings.Contains(got.Message, "does not verify against its CA") {
		t.Errorf("platform's TLS probe of a certificate named %s = %+v; want not Serving, naming the certificate", sentinel, got)
	}

	notTLS, _ := counted(t, func(c net.Conn) { _, _ = fmt.Fprint(c, "SSH-2.0-"+sentinel+"\r\n") })
	got = p.Check(ctx, tenant, "tls-not-tls", notTLS, squid.Identity(uid), other)
	t.Logf("%s: %s", "tls-not-tls", got.Message)
	if got.Serving || strings.Contains(got.Message, sentinel) || !strings.Contains(got.Message, "TLS with "+notTLS) {
		t.Errorf("tenant's TLS probe of a server that does not speak TLS = %+v; want not Serving, saying TLS failed, quoting nothing", got)
	}

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := squid.AskEgress(cctx, nil, addr, proxy.EgressCheck{URL: "http://echo.example/ip", Username: squid.CheckUsername, Password: "pw", ProxyCA: other}); err == nil || strings.Contains(err.Error(), sentinel) {
		t.Errorf("AskEgress through a proxy whose certificate does not verify = %v; want an error that does not quote it", err)
	}
}
