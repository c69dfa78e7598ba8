package kvm

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// libvirtCode returns the libvirt error code in err's chain.
func libvirtCode(err error) (libvirt.ErrorNumber, bool) {
	var le libvirt.Error
	if errors.As(err, &le) {
		return libvirt.ErrorNumber(le.Code), true
	}
	return 0, false
}

// isCode reports whether err carries one of the libvirt codes.
func isCode(err error, codes ...libvirt.ErrorNumber) bool {
	c, ok := libvirtCode(err)
	if !ok {
		return false
	}
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}

// errCredentials marks a credential that is missing (the Secret has not
// landed): Transient, and CredentialsUnavailable in Check.
var errCredentials = errors.New("credentials unavailable")

// authRefusedError is the host refusing every authentication method the
// client tried, as the dial's own record of the handshake shows it (see
// authWatch), never as the error's text suggests it: a host can put any
// phrase into what the SSH library quotes (its algorithm names, its
// disconnect message).
type authRefusedError struct {
	// err is x/crypto/ssh's error, made of the client's own words (the
	// methods it tried).
	err error
	// quiet is set for a tenant's host (a namespaced config): the message
	// is a fixed text.
	quiet bool
}

func (e *authRefusedError) Error() string {
	if e.quiet {
		return "the host refused the key"
	}
	return e.err.Error()
}

func (e *authRefusedError) Unwrap() error { return e.err }

// isSSHAuth reports an SSH authentication or host-key refusal: only an
// administrator can fix it, so it is never retried as if transient. Only
// typed errors count, never an error's text.
func isSSHAuth(err error) bool {
	var ae *authRefusedError
	if errors.As(err, &ae) {
		return true
	}
	var ke *knownhosts.KeyError
	if errors.As(err, &ke) {
		return true
	}
	var re *knownhosts.RevokedError
	return errors.As(err, &re)
}

// classify gives err its class, once, where it comes from a backend call.
// op is the driver operation: inside create a vanished domain or volume is
// Transient (it disappeared mid-call), never NotFound. Errors that already
// carry a class keep it.
func classify(op string, err error) error {
	return proxy.ClassifyWith(err, func(err error) error { return classifyLibvirt(op, err) })
}

func classifyLibvirt(op string, err error) error {
	if code, ok := libvirtCode(err); ok {
		e := &proxy.Error{Class: proxy.ClassTransient, Reason: codeName(code), Err: err}
		switch code {
		case libvirt.ErrNoDomain, libvirt.ErrNoStorageVol:
			if op != proxy.OpCreate {
				e.Class = proxy.ClassNotFound
			}
		case libvirt.ErrNoStoragePool, libvirt.ErrXMLError, libvirt.ErrNoSupport, libvirt.ErrInvalidArg,
			libvirt.ErrAuthFailed, libvirt.ErrAccessDenied:
			e.Class = proxy.ClassPermanent
		}
		return e
	}
	switch {
	case isSSHAuth(err):
		return &proxy.Error{Class: proxy.ClassPermanent, Reason: "SSHAuth", Err: err}
	case errors.Is(err, errCredentials), errors.Is(err, fs.ErrNotExist):
		return &proxy.Error{Class: proxy.ClassTransient, Reason: "CredentialsUnavailable", Err: err}
	}
	// Cancellation, deadlines, EOF, network errors and anything unknown:
	// worth a retry.
	return proxy.Classify(proxy.ClassTransient, err)
}

// codeName is the libvirt constant's name without its Err prefix, for
// Reason, logs and spans.
func codeName(c libvirt.ErrorNumber) string {
	if s := c.String(); s != "" && !strings.HasPrefix(s, "ErrorNumber(") {
		return strings.TrimPrefix(s, "Err")
	}
	return fmt.Sprintf("code%d", int(c))
}
