// Package localcrossplane runs, on this machine, what installing the
// project the Crossplane way needs around a control plane: an OCI registry
// on loopback with TLS from a CA made for it, Crossplane core with its
// package manager and RBAC manager as local processes trusting that CA,
// and a process runtime that plays the kubelet for the pods Crossplane's
// package manager makes (running each pod's image binary as a process
// under the pod's ServiceAccount). test/install and `make run`
// (cmd/local-control-plane --crossplane) share it.
package localcrossplane

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/pki"
)

// Registry is a running OCI registry (go-containerregistry's pkg/registry,
// in memory) serving TLS on a loopback address.
type Registry struct {
	// Host is host:port, as image references name it ("127.0.0.1:40123").
	Host string
	// CAPEM is the PEM of the CA that signed the registry's certificate:
	// what a client must trust.
	CAPEM []byte
	// Client reaches the registry, trusting CAPEM.
	Client ociimage.Registry

	srv  *http.Server
	done chan struct{}
}

// StartRegistry serves a registry on addr ("127.0.0.1:0" for a free port,
// "127.0.0.1:5000" for the address packages built with the default
// XPKG_REPO name) until Close. Its certificate is for 127.0.0.1, ::1 and
// localhost, from a CA made here and valid for a day.
func StartRegistry(addr string) (*Registry, error) {
	if host, _, err := net.SplitHostPort(addr); err != nil {
		return nil, err
	} else if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, errors.New("registry address " + addr + ": only loopback addresses are served")
	}
	caPEM, cert, err := newCertificates()
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		// HTTP/1.1 only, as httptest serves: pushes over HTTP/2 to this
		// handler stall.
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
		ErrorLog:          log.New(io.Discard, "", 0),
		ReadHeaderTimeout: 30 * time.Second,
	}
	r := &Registry{Host: l.Addr().String(), CAPEM: caPEM, srv: srv, done: make(chan struct{})}
	go func() { _ = srv.ServeTLS(l, "", ""); close(r.done) }()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	r.Client = ociimage.Registry{RootCAs: pool}
	return r, nil
}

// Close stops the registry; what it held is gone.
func (r *Registry) Close() error {
	err := r.srv.Close()
	<-r.done
	return err
}

// HTTPClient is a client trusting the registry's CA.
func (r *Registry) HTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.Client.RootCAs, MinVersion: tls.VersionTLS12}}}
}

// newCertificates is a throwaway CA and a server certificate it signed for
// 127.0.0.1, ::1 and localhost.
func newCertificates() ([]byte, tls.Certificate, error) {
	ca, err := pki.NewCA(pkix.Name{CommonName: "localcrossplane registry CA"}, 0)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	leaf, err := ca.Issue(pki.Leaf{Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"}, IPAddresses: pki.Loopback()})
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	return ca.CertPEM, leaf.TLS, nil
}
