package gcp

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/auth"
	"google.golang.org/api/googleapi"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// quotaReasons are the reasons of a synchronous 403 that mean "out of quota
// or rate", not "forbidden": the two share the status code, and only the
// reason in error.errors[] tells them apart.
var quotaReasons = []string{"quotaExceeded", "rateLimitExceeded", "userRateLimitExceeded", "dailyLimitExceeded"}

// quotaCodes are the error codes of a finished operation that mean the
// project or the zone is out of quota or capacity. A stockout is capacity,
// not a bad request, so it is retried like a quota failure.
var quotaCodes = []string{
	"QUOTA_EXCEEDED",
	"ZONE_RESOURCE_POOL_EXHAUSTED",
	"ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
	"RATE_LIMIT_EXCEEDED",
	"REGION_RESOURCE_POOL_EXHAUSTED",
}

// classify gives an error of a Compute Engine call its class, once, where
// it happens:
//
//	404                                           NotFound
//	429                                           Quota
//	403 with reason quotaExceeded/rateLimitExceeded Quota
//	400, 401, other 403                           Permanent
//	anything else (409, 412, 5xx), network, ctx   Transient
//
// 409 and 412 are Transient: a conflicting or stale write (a changed
// fingerprint) succeeds when retried on a fresh read.
//
// The HTTP status and the reasons are kept in the message (googleapi.Error
// prints both) and the first reason in Reason.
func classify(err error) error { return proxy.ClassifyWith(err, classifyAPI) }

func classifyAPI(err error) error {
	if credentialsRefused(err) {
		return &proxy.Error{Class: proxy.ClassPermanent, Reason: "credentials", Err: err}
	}
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		// Connection refused, TLS, DNS, a token endpoint that did not
		// answer: worth a retry.
		return proxy.Classify(proxy.ClassTransient, err)
	}
	reason := ""
	if len(ge.Errors) > 0 {
		reason = ge.Errors[0].Reason
	}
	class := classOfStatus(ge.Code, reasonsOf(ge))
	return &proxy.Error{Class: class, Reason: reason, RetryAfter: proxy.ParseRetryAfter(ge.Header, time.Now()),
		Err: apiError{code: ge.Code, reason: reason, err: ge}}
}

// credentialsRefused reports a key the token endpoint refused (a 4xx:
// a deleted key, a disabled service account) or that cannot be used at
// all (an unparsable private key): only a new key helps. A token endpoint
// that is down is Transient.
func credentialsRefused(err error) bool {
	var ae *auth.Error
	if errors.As(err, &ae) && ae.Response != nil && ae.Response.StatusCode >= 400 && ae.Response.StatusCode < 500 {
		return true
	}
	return impersonationRefused(err) || strings.Contains(err.Error(), "failed to parse private key")
}

// impersonationRefused reports an IAM Service Account Credentials API that
// answered a 4xx to generateAccessToken: the caller lacks the token
// creator role on the account (or a delegate), or the account does not
// exist. The library returns it untyped, as "impersonate: status code N".
func impersonationRefused(err error) bool {
	return strings.Contains(err.Error(), "impersonate: status code 4")
}

// classOfStatus is the class of a synchronous HTTP answer.
func classOfStatus(code int, reasons []string) proxy.Class {
	switch {
	case code == http.StatusNotFound:
		return proxy.ClassNotFound
	case code == http.StatusTooManyRequests:
		return proxy.ClassQuota
	case code == http.StatusForbidden && slices.ContainsFunc(reasons, func(r string) bool { return slices.Contains(quotaReasons, r) }):
		return proxy.ClassQuota
	case code == http.StatusBadRequest || code == http.StatusUnauthorized || code == http.StatusForbidden:
		return proxy.ClassPermanent
	}
	return proxy.ClassTransient
}

func reasonsOf(ge *googleapi.Error) []string {
	out := make([]string, 0, len(ge.Errors))
	for _, e := range ge.Errors {
		out = append(out, e.Reason)
	}
	return out
}

// apiError renders a googleapi.Error in one line: its own text
// spreads over several lines with the raw body, which a condition
// message should not carry.
type apiError struct {
	code   int
	reason string
	err    *googleapi.Error
}

func (e apiError) Error() string {
	msg := e.err.Message
	if msg == "" && len(e.err.Errors) > 0 {
		msg = e.err.Errors[0].Message
	}
	if msg == "" {
		msg = http.StatusText(e.code)
	}
	// A refused insert or setMetadata may quote the metadata sent.
	msg = telemetry.WithoutMetadataValues(msg)
	if e.reason != "" {
		return fmt.Sprintf("googleapi: %d %s: %s", e.code, e.reason, msg)
	}
	return fmt.Sprintf("googleapi: %d: %s", e.code, msg)
}

func (e apiError) Unwrap() error { return e.err }

// isNotFound reports a 404 answer.
func isNotFound(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusNotFound
}

// isAlreadyExists reports a 409 answer to an insert.
func isAlreadyExists(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusConflict
}

// OperationError is a Compute Engine operation that finished with an
// error: accepted at first, failed later (quota, a stockout, a bad
// image). It keeps GCP's code, so a condition says what went wrong.
type OperationError struct {
	// Operation is the scoped name, such as zones/z/operations/op-1.
	Operation string
	// Type is the operation type (insert, delete, ...).
	Type string
	// Target is the resource the operation worked on.
	Target string
	// HTTPStatus is httpErrorStatusCode (0 when absent).
	HTTPStatus int
	// Codes are error.errors[].code.
	Codes []string
	// Messages are error.errors[].message.
	Messages []string
	// Ended is endTime.
	Ended time.Time
}

func (e *OperationError) Error() string {
	parts := make([]string, 0, len(e.Codes))
	for i, c := range e.Codes {
		m := ""
		if i < len(e.Messages) {
			m = e.Messages[i]
		}
		parts = append(parts, c+": "+m)
	}
	status := ""
	if e.HTTPStatus != 0 {
		status = fmt.Sprintf(" (HTTP %d)", e.HTTPStatus)
	}
	return fmt.Sprintf("operation %s (%s %s) failed%s: %s", e.Operation, e.Type, lastSegment(e.Target), status, strings.Join(parts, "; "))
}

// operationError returns the error of a finished operation, nil when it
// succeeded or is still running.
func operationError(scoped string, op *computeapi.Operation) *OperationError {
	if op.GetStatus() != computeapi.OperationDone || op.GetError() == nil || len(op.GetError().GetErrors()) == 0 {
		return nil
	}
	oe := &OperationError{
		Operation:  scoped,
		Type:       op.GetOperationType(),
		Target:     op.GetTargetLink(),
		HTTPStatus: int(op.GetHttpErrorStatusCode()),
	}
	for _, e := range op.GetError().GetErrors() {
		oe.Codes = append(oe.Codes, e.GetCode())
		// A failed insert may quote the metadata it was sent.
		oe.Messages = append(oe.Messages, telemetry.WithoutMetadataValues(e.GetMessage()))
	}
	if t, err := time.Parse(time.RFC3339Nano, op.GetEndTime()); err == nil {
		oe.Ended = t
	}
	return oe
}

// classifyOperation gives a failed operation its class: quota and capacity
// codes (and a 429) are Quota, a 5xx is Transient, and everything else
// (a bad image, a missing network, a 404 on a referenced resource) is
// Permanent: a 404 inside an operation names something the instance
// needs, not the instance, so it is never NotFound.
func classifyOperation(oe *OperationError) error {
	class := proxy.ClassPermanent
	switch {
	case slices.ContainsFunc(oe.Codes, func(c string) bool { return slices.Contains(quotaCodes, c) }) || oe.HTTPStatus == http.StatusTooManyRequests:
		class = proxy.ClassQuota
	case oe.HTTPStatus >= 500:
		class = proxy.ClassTransient
	}
	reason := ""
	if len(oe.Codes) > 0 {
		reason = oe.Codes[0]
	}
	return &proxy.Error{Class: class, Reason: reason, Err: oe}
}

// alreadyExists reports a failed insert whose only error is that the
// resource exists: someone (an earlier attempt) created it first.
func (e *OperationError) alreadyExists() bool {
	return len(e.Codes) > 0 && !slices.ContainsFunc(e.Codes, func(c string) bool { return c != "RESOURCE_ALREADY_EXISTS" })
}

func lastSegment(s string) string {
	if i := strings.LastIndex(s, "/"); i >= 0 {
		return s[i+1:]
	}
	return s
}

// quietAuth hides what a tenant's token endpoint answered (the key's
// token_uri may name any server; auth.Error quotes its body), keeping the
// status and the error itself for classify; and what a connection that
// failed after an answer said (netguard.Quiet).
func quietAuth(err error) error {
	var ae *auth.Error
	if err == nil {
		return nil
	}
	if errors.As(err, &ae) {
		code := 0
		if ae.Response != nil {
			code = ae.Response.StatusCode
		}
		return &quietTokenError{err: err, code: code}
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return err
	}
	return netguard.Quiet(err, "the key's token_uri or the Google APIs")
}

type quietTokenError struct {
	err  error
	code int
}

func (e *quietTokenError) Error() string {
	return fmt.Sprintf("the token endpoint (the key's token_uri) refused the key: %d (its answer is not shown to tenants)", e.code)
}

func (e *quietTokenError) Unwrap() error { return e.err }
