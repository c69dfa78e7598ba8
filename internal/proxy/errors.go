package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Class is how the controller should react to an error.
type Class string

// Error classes. Drivers classify once, at the source.
const (
	// ClassNotFound: the instance does not exist.
	ClassNotFound Class = "NotFound"
	// ClassTransient: try again later (a busy backend, a lock, a timeout).
	ClassTransient Class = "Transient"
	// ClassPermanent: retrying will not help until someone changes the
	// managed resource, the ProviderConfig or the backend (bad input,
	// refused credentials, a foreign instance with our name).
	ClassPermanent Class = "Permanent"
	// ClassQuota: the backend is out of capacity or quota.
	ClassQuota Class = "Quota"
)

// Error is a classified driver error. Its message never holds secrets.
type Error struct {
	// Class decides the reaction.
	Class Class
	// Provider is the configured name of the backend (the ProviderConfig's
	// name), so messages say which config failed.
	Provider string
	// Op is the driver operation (create, get, update, delete, list, check).
	Op string
	// Reason is an optional backend code (quotaExceeded, a libvirt code).
	Reason string
	// RetryAfter is how long the backend asked callers to wait before
	// trying again (an HTTP Retry-After); 0 when it did not say. The
	// controller waits at least that long before the next reconcile.
	RetryAfter time.Duration
	// Err is the cause.
	Err error
}

func (e *Error) Error() string {
	msg := ""
	if e.Err != nil {
		msg = e.Err.Error()
	}
	prefix := ""
	if e.Provider != "" {
		prefix = e.Provider + ": "
	}
	if e.Op != "" {
		prefix += e.Op + ": "
	}
	return prefix + msg
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Classify wraps err with class, unless it already carries a class. A nil
// err stays nil.
func Classify(class Class, err error) error {
	if err == nil {
		return nil
	}
	var pe *Error
	if errors.As(err, &pe) {
		return err
	}
	return &Error{Class: class, Err: err}
}

// MissingOnCreate is what a driver's Create returns for err: a NotFound
// from a step of Create names something the create needs (a template, an
// image, a network, a zone, a namespace), not the instance, and no retry
// brings it back, so it is Permanent, its message kept and saying so.
// Create never returns NotFound (the conformance suite and each driver's
// tests hold it to that); other classes pass through.
// The provider and operation err names stay on the result, outermost.
func MissingOnCreate(err error) error {
	var pe *Error
	if ClassOf(err) != ClassNotFound || !errors.As(err, &pe) {
		return err
	}
	cause := err
	if error(pe) == err { //nolint:errorlint // Identity: is err the *Error itself, not one it wraps.
		cause = pe.Err // its provider and operation move to the result
	}
	return &Error{Class: ClassPermanent, Provider: pe.Provider, Op: pe.Op, Reason: "MissingDependency",
		Err: fmt.Errorf("something the proxy needs does not exist: %w", cause)}
}

// ReasonUnresolved is the Reason of an error saying that a Ref without an
// ID names no place the driver can look in (no location, or one its
// config lacks): nothing of the instance can be found, or deleted, by it.
const ReasonUnresolved = "Unresolved"

// Unresolvedf is a Permanent error with ReasonUnresolved. A driver's Get
// and Delete return it, for a Ref without an ID, only when they cannot
// look anywhere: the controller lets go of a resource being deleted that
// never made an instance on it (a spec naming a key the config lacks).
func Unresolvedf(format string, args ...any) error {
	return &Error{Class: ClassPermanent, Reason: ReasonUnresolved, Err: fmt.Errorf(format, args...)}
}

// IsUnresolved reports whether err is Unresolvedf's (the first *Error in
// its chain is Permanent with ReasonUnresolved).
func IsUnresolved(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.Class == ClassPermanent && pe.Reason == ReasonUnresolved
}

// Errorf builds a classified error from a format string.
func Errorf(class Class, format string, args ...any) error {
	return &Error{Class: class, Err: fmt.Errorf(format, args...)}
}

// NotFoundf is Errorf(ClassNotFound, ...).
func NotFoundf(format string, args ...any) error { return Errorf(ClassNotFound, format, args...) }

// Transientf is Errorf(ClassTransient, ...).
func Transientf(format string, args ...any) error { return Errorf(ClassTransient, format, args...) }

// Permanentf is Errorf(ClassPermanent, ...).
func Permanentf(format string, args ...any) error { return Errorf(ClassPermanent, format, args...) }

// Quotaf is Errorf(ClassQuota, ...).
func Quotaf(format string, args ...any) error { return Errorf(ClassQuota, format, args...) }

// WithContext sets Provider and Op on the outermost *Error in err (adding a
// Transient one when err is unclassified), so every error leaving a driver
// names its configured provider and operation. When the *Error is wrapped
// (fmt.Errorf("deleting disk: %w", classified)), the wrapping text is kept:
// the result is a new *Error of the same class around the whole of err. An
// *Error without a class becomes Transient.
func WithContext(err error, provider, op string) error {
	if err == nil {
		return nil
	}
	var pe *Error
	if !errors.As(err, &pe) {
		// Unclassified errors (including a cancelled ctx) are worth a retry.
		return &Error{Class: ClassTransient, Provider: provider, Op: op, Err: err}
	}
	if pe.Class != "" && pe.Provider != "" && pe.Op != "" {
		return err // nothing to add; keep err, wrapping and all
	}
	var cp Error
	if error(pe) == err { //nolint:errorlint // Identity: is err the *Error itself, not one it wraps.
		cp = *pe
	} else {
		// Copying pe would drop whatever err wraps around it.
		cp = Error{Class: pe.Class, Provider: pe.Provider, Op: pe.Op, Reason: pe.Reason, RetryAfter: pe.RetryAfter, Err: err}
	}
	if cp.Class == "" {
		cp.Class = ClassTransient
	}
	if cp.Provider == "" {
		cp.Provider = provider
	}
	if cp.Op == "" {
		cp.Op = op
	}
	return &cp
}

// ClassOf returns err's class: the class of the first *Error in its chain,
// Transient for an unclassified error, and "" for nil.
func ClassOf(err error) Class {
	if err == nil {
		return ""
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Class
	}
	return ClassTransient
}

// IsNotFound reports whether err is classified NotFound.
func IsNotFound(err error) bool { return ClassOf(err) == ClassNotFound }

// IsPermanent reports whether err is classified Permanent.
func IsPermanent(err error) bool { return ClassOf(err) == ClassPermanent }

// IsQuota reports whether err is classified Quota.
func IsQuota(err error) bool { return ClassOf(err) == ClassQuota }

// IsTransient reports whether err is classified Transient (or unclassified).
func IsTransient(err error) bool { return ClassOf(err) == ClassTransient }

// RetryAfterOf returns the RetryAfter of the first *Error in err's chain
// that sets one, 0 when none does.
func RetryAfterOf(err error) time.Duration {
	for err != nil {
		var pe *Error
		if !errors.As(err, &pe) {
			return 0
		}
		if pe.RetryAfter > 0 {
			return pe.RetryAfter
		}
		err = pe.Err
	}
	return 0
}

// maxRetryAfter bounds what a backend's Retry-After can ask for.
const maxRetryAfter = time.Hour

// ParseRetryAfter reads an HTTP Retry-After header: delay-seconds or an
// HTTP date (relative to now), at most an hour; 0 when absent, past or
// malformed.
func ParseRetryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.Atoi(v); err == nil {
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), maxRetryAfter)
}
