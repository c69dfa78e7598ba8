package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"testing"
	"time"
)

// Certs are a proxy's certificate as cert-manager's CA issuer writes it
// into a kubernetes.io/tls Secret: a root CA, an intermediate, and a leaf
// for the proxy's hosts.
type Certs struct {
	// Chain is tls.crt: the leaf, then the intermediate.
	Chain string
	// Key is tls.key: the leaf's private key (SEC 1).
	Key string
	// CA is ca.crt: the root.
	CA string
}

// Secret is the data of the kubernetes.io/tls Secret holding c.
func (c Certs) Secret() map[string][]byte {
	return map[string][]byte{"tls.crt": []byte(c.Chain), "tls.key": []byte(c.Key), "ca.crt": []byte(c.CA)}
}

// NewCerts makes Certs for hosts (names or IP addresses), valid for a day.
func NewCerts(t testing.TB, hosts ...string) Certs {
	t.Helper()
	now := time.Now()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(0)
	sign := func(tmpl *x509.Certificate, parent *x509.Certificate, pub any, signer *ecdsa.PrivateKey) *x509.Certificate {
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		if parent == nil {
			parent = tmpl
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ca := func(name string) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	}
	rootKey, interKey, leafKey := newKey(), newKey(), newKey()
	root := sign(ca("egressproxy test root"), nil, &rootKey.PublicKey, rootKey)
	inter := sign(ca("egressproxy test intermediate"), root, &interKey.PublicKey, rootKey)
	leafTmpl := &x509.Certificate{Subject: pkix.Name{CommonName: "egress proxy"}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			leafTmpl.IPAddresses = append(leafTmpl.IPAddresses, ip)
		} else {
			leafTmpl.DNSNames = append(leafTmpl.DNSNames, h)
		}
	}
	leaf := sign(leafTmpl, inter, &leafKey.PublicKey, interKey)
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(typ string, der []byte) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	return Certs{
		Chain: enc("CERTIFICATE", leaf.Raw) + enc("CERTIFICATE", inter.Raw),
		Key:   enc("EC PRIVATE KEY", keyDER),
		CA:    enc("CERTIFICATE", root.Raw),
	}
}
