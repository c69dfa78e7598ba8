package squid

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Keys of a TLS Secret, in the layout of Kubernetes' kubernetes.io/tls
// type, which cert-manager writes (with ca.crt when it knows the CA).
const (
	TLSCertKey = "tls.crt"
	TLSKeyKey  = "tls.key"
	TLSCAKey   = "ca.crt"
)

// LoadTLS checks a TLS Secret's data and returns the proxy's TLS: the
// chain of tls.crt (the proxy's certificate first), the key of tls.key,
// which must be that certificate's, and the CA clients verify it against:
// ca.crt when the Secret has one, else the chain's last certificate, plus
// the chain's intermediates (see below). The chain must verify against
// that CA, and the certificate must not have expired at now. Errors name the Secret's key and never quote its
// content; they are classified proxy.ClassPermanent.
func LoadTLS(data map[string][]byte, now time.Time) (*proxy.TLS, error) {
	chain, err := parseCerts(TLSCertKey, data[TLSCertKey])
	if err != nil {
		return nil, err
	}
	leaf := chain[0]
	key, keyPEM, err := parseKey(data[TLSKeyKey])
	if err != nil {
		return nil, err
	}
	if pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(leaf.PublicKey) {
		return nil, proxy.Permanentf("%s is not the private key of the first certificate in %s (%s)", TLSKeyKey, TLSCertKey, describeCert(leaf))
	}
	if now.After(leaf.NotAfter) {
		return nil, proxy.Permanentf("the first certificate in %s (%s) expired at %s", TLSCertKey, describeCert(leaf), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	caSource := "the last certificate of " + TLSCertKey
	ca := chain[len(chain)-1:]
	if len(bytes.TrimSpace(data[TLSCAKey])) > 0 {
		if ca, err = parseCerts(TLSCAKey, data[TLSCAKey]); err != nil {
			return nil, err
		}
		caSource = TLSCAKey
	}
	if err := verifyChain(chain, ca, now); err != nil {
		return nil, proxy.Permanentf("%s does not verify against %s, which clients are given to trust: %v", TLSCertKey, caSource, err)
	}
	// Debian's Squid, built with GnuTLS, sends the proxy's certificate
	// without the intermediates of its tls-cert file: clients get them
	// with the CA, to build the chain themselves.
	trust := slices.Clone(ca)
	for _, c := range chain[1:] {
		if !slices.ContainsFunc(trust, c.Equal) {
			trust = append(trust, c)
		}
	}
	return &proxy.TLS{Cert: string(encodeCerts(chain)), Key: string(keyPEM), CA: string(encodeCerts(trust))}, nil
}

// parseCerts parses every PEM block of b, which must all be certificates.
func parseCerts(name string, b []byte) ([]*x509.Certificate, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, proxy.Permanentf("the Secret has no key %s (a PEM certificate)", name)
	}
	var out []*x509.Certificate
	rest := b
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			// The type only: a key pasted here is never quoted.
			return nil, proxy.Permanentf("%s holds a PEM block of type %q; want CERTIFICATE blocks only", name, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, proxy.Permanentf("%s: certificate %d does not parse: %v", name, len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, proxy.Permanentf("%s holds no PEM certificate", name)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, proxy.Permanentf("%s holds something other than PEM after its certificate %d", name, len(out))
	}
	return out, nil
}

// parseKey parses the private key of tls.key: the first PEM block whose
// type is a private key's (an "EC PARAMETERS" block may come first), in
// PKCS #8, PKCS #1 or SEC 1, and that block alone, PEM-encoded again.
// Its errors name no part of the key.
func parseKey(b []byte) (crypto.Signer, []byte, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil, proxy.Permanentf("the Secret has no key %s (a PEM private key)", TLSKeyKey)
	}
	rest := b
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, nil, proxy.Permanentf("%s holds no PEM private key", TLSKeyKey)
		}
		switch {
		case block.Type == "ENCRYPTED PRIVATE KEY" || block.Headers["Proc-Type"] != "":
			return nil, nil, proxy.Permanentf("%s is encrypted; Squid needs the key unencrypted", TLSKeyKey)
		case !strings.HasSuffix(block.Type, "PRIVATE KEY"):
			continue
		}
		var k any
		var err error
		switch block.Type {
		case "RSA PRIVATE KEY":
			k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			k, err = x509.ParseECPrivateKey(block.Bytes)
		default:
			k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		}
		if err != nil {
			// x509's errors describe the structure, never the key's bytes.
			return nil, nil, proxy.Permanentf("%s does not parse as a %s: %v", TLSKeyKey, block.Type, err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, nil, proxy.Permanentf("%s holds a key of a type TLS cannot use (%T)", TLSKeyKey, k)
		}
		return s, pem.EncodeToMemory(&pem.Block{Type: block.Type, Bytes: block.Bytes}), nil
	}
}

// verifyChain checks that chain (leaf first) verifies against roots at
// now, for any purpose, and names nothing: the name is the clients'
// business (see ClientTLS).
func verifyChain(chain, roots []*x509.Certificate, now time.Time) error {
	pool := x509.NewCertPool()
	for _, c := range roots {
		pool.AddCert(c)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

func encodeCerts(cs []*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range cs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// describeCert names a certificate for a message: its subject and the
// names it is valid for, which are public.
func describeCert(c *x509.Certificate) string {
	names := append([]string{}, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 {
		return "subject " + c.Subject.String()
	}
	return "subject " + c.Subject.String() + ", for " + strings.Join(names, ", ")
}

// ClientTLS is the TLS configuration with which the provider connects to
// a proxy listening with TLS (the readiness probe, the egress check): it
// verifies the proxy's certificate chain against ca (PEM), but not the
// name in it, since the provider reaches the proxy at an address of its
// own (a pod's, an internal one) that the certificate, made for the host
// clients use, need not name. Which Squid answers is the identity's
// business (Ask).
func ClientTLS(ca string) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(ca)) {
		return nil, errors.New("the proxy's CA holds no PEM certificate")
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verified below against ca, without the name.
		InsecureSkipVerify: true, //nolint:gosec // VerifyConnection verifies the chain.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errNoCert
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
			if err != nil {
				return &certError{cert: cs.PeerCertificates[0], err: err}
			}
			return nil
		},
	}, nil
}

// errNoCert is the error of a proxy that sent no certificate.
var errNoCert = errors.New("the proxy sent no certificate")

// certError is a proxy certificate that does not verify against the
// proxy's CA. Its text names the certificate (describeCert) and quotes
// x509's reason, which names the certificate's issuer or dates: for the
// platform's configs, whose operators read it. The probe of an address a
// tenant's backend reported says certNotVerified instead (quiet).
type certError struct {
	cert *x509.Certificate
	err  error
}

func (e *certError) Error() string {
	return fmt.Sprintf("the proxy's certificate (%s) does not verify against its CA: %v", describeCert(e.cert), e.err)
}

func (e *certError) Unwrap() error { return e.err }

// certNotVerified is the text of a certError that quotes nothing the
// certificate holds.
const certNotVerified = "the proxy's certificate does not verify against the proxy's CA (what it holds is not shown to tenants)"
