// Package pki makes the throwaway certificate authorities, and the
// certificates they sign, that the project's local servers need: the OCI
// registry of internal/localcrossplane, the node's kubelet client
// certificates (internal/devenv/controlplane), the Proxmox fake (pvetest) and the
// composition function served to Crossplane in test/compositions. Every
// key is ECDSA P-256; every serial number is random, so two authorities
// made in one run never look alike to a client.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// DefaultValidity is how long a certificate is valid when its ValidFor is
// zero: long enough for a test run or a `make run` session of a day.
const DefaultValidity = 24 * time.Hour

// backdate is how far before now a certificate starts, so that a clock a
// little behind this machine's still accepts it.
const backdate = time.Hour

// CA is a certificate authority: its certificate (also as PEM, what a
// client puts in its trust pool) and the key it signs with.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	Key     crypto.Signer
}

// NewCA makes a self-signed CA with a new key, valid for validFor from
// now (DefaultValidity when zero).
func NewCA(subject pkix.Name, validFor time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:               subject,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	if err := setValidity(tmpl, validFor); err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate %q: %w", subject.CommonName, err)
	}
	return newCA(der, key)
}

// LoadCA reads a CA someone else made (Crossplane's root CA Secret, say)
// from the PEM of its certificate and of its private key (PKCS #1, SEC 1
// or PKCS #8).
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("pki: CA certificate: no PEM CERTIFICATE block")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("pki: CA key: no PEM block")
	}
	key, err := parseKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	return newCA(cb.Bytes, key)
}

func newCA(der []byte, key crypto.Signer) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Key: key}, nil
}

func parseKey(der []byte) (crypto.Signer, error) {
	if k, err := x509.ParsePKCS1PrivateKey(der); err == nil {
		return k, nil
	}
	if k, err := x509.ParseECPrivateKey(der); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, errors.New("neither PKCS #1, SEC 1 nor PKCS #8")
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("a %T cannot sign", k)
	}
	return s, nil
}

// Leaf is what a certificate the CA signs is for.
type Leaf struct {
	Subject pkix.Name
	// DNSNames and IPAddresses are the names a client may reach it by
	// (server certificates).
	DNSNames    []string
	IPAddresses []net.IP
	// Client makes a client certificate (TLS client authentication);
	// otherwise it is a server certificate.
	Client bool
	// ValidFor is how long it is valid from now; DefaultValidity when zero.
	ValidFor time.Duration
}

// Loopback is 127.0.0.1 and ::1, the addresses every local server here
// listens on.
func Loopback() []net.IP { return []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback} }

// Pair is a certificate and its key, as PEM (to write to files) and as a
// tls.Certificate (to serve with).
type Pair struct {
	CertPEM []byte
	KeyPEM  []byte
	TLS     tls.Certificate
}

// Issue makes a new key and a certificate for it signed by the CA.
func (ca *CA) Issue(l Leaf) (*Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: key for %q: %w", l.Subject.CommonName, err)
	}
	usage := x509.ExtKeyUsageServerAuth
	if l.Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		Subject:     l.Subject,
		DNSNames:    l.DNSNames,
		IPAddresses: l.IPAddresses,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if err := setValidity(tmpl, l.ValidFor); err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: certificate for %q: %w", l.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: key for %q: %w", l.Subject.CommonName, err)
	}
	return &Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		TLS:     tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
	}, nil
}

// setValidity gives tmpl a random serial number and its validity period.
func setValidity(tmpl *x509.Certificate, validFor time.Duration) error {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return fmt.Errorf("pki: serial number: %w", err)
	}
	if validFor == 0 {
		validFor = DefaultValidity
	}
	now := time.Now()
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-backdate), now.Add(validFor)
	return nil
}
