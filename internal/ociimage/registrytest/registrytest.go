// Package registrytest runs an OCI registry (go-containerregistry's
// pkg/registry, in memory) on a loopback port with TLS from a CA made for
// it, for tests that push and pull images and packages the way users do.
package registrytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/egressproxy/provider-egressproxy/internal/ociimage"
)

// Registry is a running registry.
type Registry struct {
	// Host is host:port, as image references name it ("127.0.0.1:40123").
	Host string
	// CAPEM is the PEM of the CA that signed the registry's certificate:
	// what a client must trust.
	CAPEM []byte
	// Client reaches the registry, trusting CAPEM.
	Client ociimage.Registry
}

// Start runs a registry until the test ends.
func Start(t testing.TB) *Registry {
	t.Helper()
	caPEM, cert, err := newCertificates()
	if err != nil {
		t.Fatalf("registrytest: certificates: %v", err)
	}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &Registry{
		Host:   srv.Listener.Addr().String(),
		CAPEM:  caPEM,
		Client: ociimage.Registry{RootCAs: pool},
	}
}

// HTTPClient is a client trusting the registry's CA.
func (r *Registry) HTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.Client.RootCAs, MinVersion: tls.VersionTLS12}}}
}

// newCertificates is a throwaway CA and a server certificate it signed for
// 127.0.0.1, ::1 and localhost.
func newCertificates() ([]byte, tls.Certificate, error) {
	serial := func() *big.Int {
		n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
		return n
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "registrytest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	leaf := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
