package pvetest

import (
	"crypto/tls"
	"crypto/x509/pkix"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/pki"
)

// authority is a throwaway CA and the server certificate it signed, so
// that every fake has its own trust root (httptest's built-in certificate
// is the same for every server, which would make a wrong-CA test pass by
// accident).
type authority struct {
	caPEM []byte
	cert  tls.Certificate
}

// newAuthority names the CA as Proxmox VE's own cluster CA is named.
func newAuthority(commonName string) (*authority, error) {
	ca, err := pki.NewCA(pkix.Name{CommonName: commonName + " CA", Organization: []string{"PVE Cluster Manager CA"}}, 0)
	if err != nil {
		return nil, err
	}
	leaf, err := ca.Issue(pki.Leaf{
		Subject:     pkix.Name{CommonName: commonName},
		DNSNames:    []string{"localhost", commonName},
		IPAddresses: pki.Loopback(),
	})
	if err != nil {
		return nil, err
	}
	return &authority{caPEM: ca.CertPEM, cert: leaf.TLS}, nil
}
