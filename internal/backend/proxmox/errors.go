package proxmox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Texts of the API's 500 answers the driver acts on, as PVE words them
// (qemu-server, pve-storage, pve-common). Each matcher is anchored to the
// 500 status: the same words in a 4xx mean something else. Every other
// 500 (a config lock "VM is locked (backup)", a task holding the file
// lock "can't lock file ... got timeout", a stale digest "detected
// modified configuration") is Transient: it clears by itself or by an
// admin's hand, and the call is retried.
const (
	// PVE::QemuConfig->load_config: "Configuration file
	// 'nodes/pve1/qemu-server/100.conf' does not exist".
	textNoConfig = "does not exist"
	// clone/create: "unable to create VM 100: config file already exists".
	textExists = "config file already exists"
	// Guest agent answers.
	textAgentNotRunning = "QEMU guest agent is not running"
	textNoAgent         = "No QEMU guest agent configured"
	textVMNotRunning    = "not running"
	// clone with target on local storage.
	textLocalStorage = "VM uses local storage"
)

// apiText returns the server's error text of a 500, or "".
func apiText(err error) string {
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == 500 {
		return ae.Message
	}
	return ""
}

func isNotExist(err error) bool { return strings.Contains(apiText(err), textNoConfig) }

func isExists(err error) bool { return strings.Contains(apiText(err), textExists) }

func statusOf(err error) int {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// classify gives err its class, once, where the driver meets it: an
// already classified error keeps its class; the API's answers by status
// and text; TLS verification failures are Permanent (a wrong CA or
// hostname does not fix itself); everything else (network, timeouts,
// cancellation) is Transient.
func classify(err error) error { return proxy.ClassifyWith(err, classifyAPI) }

func classifyAPI(err error) error {
	var ae *APIError
	if errors.As(err, &ae) {
		switch {
		case ae.Status == http.StatusTooManyRequests:
			// Not PVE's own answer: a rate limit in front of it, which
			// clears by itself.
			return &proxy.Error{Class: proxy.ClassTransient, Reason: "RateLimited", RetryAfter: ae.RetryAfter, Err: err}
		case ae.Status == 401:
			return &proxy.Error{Class: proxy.ClassPermanent, Reason: "Unauthorized", Err: err}
		case ae.Status == 403:
			return &proxy.Error{Class: proxy.ClassPermanent, Reason: "Forbidden", Err: err}
		case ae.Status >= 400 && ae.Status < 500, ae.Status == 501:
			// Parameter verification, an unknown method: the request is
			// wrong and will stay wrong.
			return &proxy.Error{Class: proxy.ClassPermanent, Err: err}
		case ae.Status == 500 && strings.Contains(ae.Message, textLocalStorage):
			return &proxy.Error{Class: proxy.ClassPermanent, Err: err}
		case ae.Status == 500 && strings.Contains(ae.Message, textNoConfig):
			return &proxy.Error{Class: proxy.ClassNotFound, Err: err}
		default:
			// Locks, a VMID taken meanwhile, 595/596 from pveproxy: busy.
			return &proxy.Error{Class: proxy.ClassTransient, RetryAfter: ae.RetryAfter, Err: err}
		}
	}
	if isTLSVerification(err) {
		return &proxy.Error{Class: proxy.ClassPermanent, Reason: "CertificateInvalid", Err: err}
	}
	return &proxy.Error{Class: proxy.ClassTransient, Err: err}
}

// isTLSVerification reports a certificate the client refused.
func isTLSVerification(err error) bool {
	var (
		cv  *tls.CertificateVerificationError
		ua  x509.UnknownAuthorityError
		hn  x509.HostnameError
		inv x509.CertificateInvalidError
	)
	return errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &inv)
}

// isUnreachable reports a node or API that did not answer: pveproxy's 595
// and 596, or a network error before any answer.
func isUnreachable(err error) bool {
	if s := statusOf(err); s == 595 || s == 596 {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &oe) || (errors.As(err, &ne) && !ne.Timeout())
}
