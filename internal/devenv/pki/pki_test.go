package pki

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"strings"
	"testing"
	"time"
)

func pool(t *testing.T, pems ...[]byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	for _, b := range pems {
		if !p.AppendCertsFromPEM(b) {
			t.Fatal("CA PEM does not parse")
		}
	}
	return p
}

func leafOf(t *testing.T, p *Pair) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(p.TLS.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestIssue checks what a client verifying the certificate sees: the names
// and addresses it is valid for, the use it is valid for, its lifetime,
// and that only its own CA vouches for it.
func TestIssue(t *testing.T) {
	ca, err := NewCA(pkix.Name{CommonName: "test CA", Organization: []string{"Org"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA(pkix.Name{CommonName: "test CA"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ca.Cert.SerialNumber.Cmp(other.Cert.SerialNumber) == 0 {
		t.Error("two CAs made in one run have the same serial number")
	}
	if got := ca.Cert.Subject.Organization; len(got) != 1 || got[0] != "Org" {
		t.Errorf("CA organization = %q, want [Org]", got)
	}

	cases := map[string]struct {
		leaf  Leaf
		usage x509.ExtKeyUsage
		name  string
		life  time.Duration
	}{
		"ServerForLoopback": {
			leaf:  Leaf{Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost", "pve.example"}, IPAddresses: Loopback()},
			usage: x509.ExtKeyUsageServerAuth, name: "pve.example", life: DefaultValidity,
		},
		"ClientForTenYears": {
			leaf:  Leaf{Subject: pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}, Client: true, ValidFor: 10 * 365 * 24 * time.Hour},
			usage: x509.ExtKeyUsageClientAuth, life: 10 * 365 * 24 * time.Hour,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := ca.Issue(tc.leaf)
			if err != nil {
				t.Fatal(err)
			}
			c := leafOf(t, p)
			opts := x509.VerifyOptions{Roots: pool(t, ca.CertPEM), DNSName: tc.name, KeyUsages: []x509.ExtKeyUsage{tc.usage}}
			if _, err := c.Verify(opts); err != nil {
				t.Errorf("Verify against its CA: %v", err)
			}
			opts.Roots = pool(t, other.CertPEM)
			if _, err := c.Verify(opts); err == nil {
				t.Error("Verify against another CA of the same name succeeded")
			}
			if tc.name != "" {
				for _, ip := range []string{"127.0.0.1", "::1"} {
					if err := c.VerifyHostname(ip); err != nil {
						t.Errorf("VerifyHostname(%s): %v", ip, err)
					}
				}
			}
			if got := c.NotAfter.Sub(c.NotBefore); got != tc.life+backdate {
				t.Errorf("valid for %v, want %v", got, tc.life+backdate)
			}
			if c.NotBefore.After(time.Now()) {
				t.Errorf("NotBefore %v is in the future", c.NotBefore)
			}
			if b, _ := pem.Decode(p.KeyPEM); b == nil || b.Type != "EC PRIVATE KEY" {
				t.Errorf("KeyPEM is not an EC PRIVATE KEY block: %q", p.KeyPEM)
			}
			if b, _ := pem.Decode(p.CertPEM); b == nil || string(b.Bytes) != string(p.TLS.Certificate[0]) {
				t.Error("CertPEM is not the certificate TLS serves")
			}
		})
	}
}

// TestLoadCA signs with a CA read back from PEM, as test/compositions does
// with Crossplane's root CA (an RSA key in whichever encoding).
func TestLoadCA(t *testing.T) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: "crossplane-root-ca"}, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	if err := setValidity(tmpl, 0); err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &rk.PublicKey, rk)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	pkcs8, err := x509.MarshalPKCS8PrivateKey(rk)
	if err != nil {
		t.Fatal(err)
	}
	for name, keyPEM := range map[string][]byte{
		"PKCS1": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rk)}),
		"PKCS8": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
	} {
		t.Run(name, func(t *testing.T) {
			ca, err := LoadCA(certPEM, keyPEM)
			if err != nil {
				t.Fatal(err)
			}
			p, err := ca.Issue(Leaf{Subject: pkix.Name{CommonName: "fn"}, DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := leafOf(t, p).Verify(x509.VerifyOptions{Roots: pool(t, certPEM), DNSName: "localhost"}); err != nil {
				t.Errorf("Verify against the loaded CA: %v", err)
			}
		})
	}

	errs := map[string]struct {
		cert, key []byte
		want      string
	}{
		"NoCertificate": {cert: []byte("not PEM"), key: certPEM, want: "pki: CA certificate: no PEM CERTIFICATE block"},
		"NoKey":         {cert: certPEM, key: []byte("not PEM"), want: "pki: CA key: no PEM block"},
		"KeyNotAKey":    {cert: certPEM, key: certPEM, want: "pki: CA key: neither PKCS #1, SEC 1 nor PKCS #8"},
	}
	for name, tc := range errs {
		t.Run(name, func(t *testing.T) {
			_, err := LoadCA(tc.cert, tc.key)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("LoadCA: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
