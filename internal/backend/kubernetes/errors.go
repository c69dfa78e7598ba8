package kubernetes

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// classify gives an error from the Kubernetes API its class, once, where it
// happens:
//
//	404 Not Found                               NotFound
//	403 whose message says "exceeded quota"     Quota (a ResourceQuota refused it)
//	403 in a namespace being terminated         Transient
//	other 403, 401                              Permanent (RBAC, credentials)
//	400, 422 Invalid, 413, 405, 406, 415        Permanent
//	409 Conflict and AlreadyExists              Transient (a stale read; retry)
//	429, 5xx, timeouts, network, ctx            Transient
//
// A ResourceQuota's 403 and an RBAC 403 share a status and a reason; only
// the message (the quota admission plugin's "exceeded quota: <name>, ...")
// tells them apart. "failed quota" (a quota requiring limits the object does
// not set) is Permanent: only a changed config helps.
func classify(err error) error { return proxy.ClassifyWith(err, classifyAPI) }

func classifyAPI(err error) error {
	var status kerrors.APIStatus
	if !errors.As(err, &status) {
		// Network errors, TLS handshakes, a kubeconfig's server gone.
		return proxy.Classify(proxy.ClassTransient, err)
	}
	switch {
	case kerrors.IsNotFound(err):
		return proxy.Classify(proxy.ClassNotFound, err)
	case kerrors.IsForbidden(err):
		msg := status.Status().Message
		switch {
		case strings.Contains(msg, "exceeded quota"):
			return &proxy.Error{Class: proxy.ClassQuota, Reason: "exceeded quota", Err: err}
		case hasCause(status, "NamespaceTerminating") || strings.Contains(msg, "being terminated"):
			return proxy.Classify(proxy.ClassTransient, err)
		}
		return proxy.Classify(proxy.ClassPermanent, err)
	case kerrors.IsUnauthorized(err), kerrors.IsInvalid(err), kerrors.IsBadRequest(err),
		kerrors.IsRequestEntityTooLargeError(err), kerrors.IsMethodNotSupported(err),
		kerrors.IsNotAcceptable(err), kerrors.IsUnsupportedMediaType(err):
		return proxy.Classify(proxy.ClassPermanent, err)
	}
	// Conflicts, AlreadyExists out of context, throttling, timeouts, 5xx;
	// a 429 or 5xx that said how long to wait (client-go has already
	// retried it) is waited that long.
	if s, ok := kerrors.SuggestsClientDelay(err); ok && s > 0 {
		return &proxy.Error{Class: proxy.ClassTransient, RetryAfter: time.Duration(s) * time.Second, Err: err}
	}
	return proxy.Classify(proxy.ClassTransient, err)
}

func hasCause(status kerrors.APIStatus, t metav1.CauseType) bool {
	if d := status.Status().Details; d != nil {
		for _, c := range d.Causes {
			if c.Type == t {
				return true
			}
		}
	}
	return false
}

// quietStatus hides the message of an API server's error answer (a
// tenant's server, which may be any HTTP service: client-go quotes a body
// it cannot decode in the message), keeping its status code and reason,
// and the error itself for classify; and what a connection that failed
// after an answer said (netguard.Quiet).
//
// A refused value of the config (validate) is the provider's own words and
// passes as it is. A 422 Invalid answer to a write of a proxy's Deployment
// names the fields of the config that feed it (the provider's own paths,
// not the server's words).
func quietStatus(err error) error {
	var status kerrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		if ce := (*ownWords)(nil); errors.As(err, &ce) {
			return err
		}
		return netguard.Quiet(err, "the kubeconfig's server")
	}
	q := &quietError{err: err, code: status.Status().Code, reason: string(status.Status().Reason)}
	var dw *deploymentWriteError
	if kerrors.IsInvalid(err) && errors.As(err, &dw) {
		q.hint = fmt.Sprintf(" to the %s of Deployment %s, whose pods take the config's values as they are: %s", dw.verb, dw.key, deploymentConfigHint)
	}
	return q
}

// deploymentConfigHint names the fields of the config's kubernetes block
// that go into a proxy's pod template as they are: the ones to look at
// when the server refuses the Deployment (422 Invalid).
const deploymentConfigHint = "check spec.kubernetes.resources, nodeSelector, tolerations, affinity and imagePullSecrets"

type quietError struct {
	err    error
	code   int32
	reason string
	// hint says where to look, in the provider's own words.
	hint string
}

func (e *quietError) Error() string {
	return fmt.Sprintf("the kubeconfig's server answered %d %s (its message is not shown to tenants)%s", e.code, e.reason, e.hint)
}

func (e *quietError) Unwrap() error { return e.err }

// deploymentWriteError is a failed create or update of a proxy's
// Deployment. It reads "cannot <verb> Deployment <ns>/<name>: <err>", and
// lets quietStatus tell a refused Deployment from other refused writes.
type deploymentWriteError struct {
	verb string
	key  types.NamespacedName
	err  error
}

func (e *deploymentWriteError) Error() string {
	return fmt.Sprintf("cannot %s Deployment %s: %v", e.verb, e.key, e.err)
}

func (e *deploymentWriteError) Unwrap() error { return e.err }

// secretWriteError is a failed write of a proxy's Secret. An API
// server's answer is shown by its status, reason and the fields it
// refused, never its message: a validation error or an admission
// webhook's denial may quote the Secret's data (the htpasswd, the TLS
// key). Errors of the provider's own (a name taken) show as they are.
type secretWriteError struct {
	key types.NamespacedName
	err error
}

func (e *secretWriteError) Error() string {
	var status kerrors.APIStatus
	if !errors.As(e.err, &status) {
		return fmt.Sprintf("cannot write Secret %s: %v", e.key, e.err)
	}
	s := status.Status()
	msg := fmt.Sprintf("cannot write Secret %s: the server answered %d %s (its message is not shown: it may quote the Secret's data)", e.key, s.Code, s.Reason)
	if proxy.IsQuota(classifyAPI(e.err)) {
		msg += ": exceeded quota, a ResourceQuota of the namespace refused it"
	}
	if s.Details != nil {
		fields := make([]string, 0, len(s.Details.Causes))
		for _, c := range s.Details.Causes {
			if c.Field != "" && !slices.Contains(fields, c.Field) {
				fields = append(fields, c.Field)
			}
		}
		if len(fields) > 0 {
			msg += " for " + strings.Join(fields, ", ")
		}
	}
	return msg
}

func (e *secretWriteError) Unwrap() error { return e.err }
