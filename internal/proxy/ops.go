package proxy

import (
	"context"
	"errors"
)

// The driver operations, as they appear in (*Error).Op.
const (
	OpCreate = "create"
	OpGet    = "get"
	OpUpdate = "update"
	OpDelete = "delete"
	OpList   = "list"
	OpCheck  = "check"
)

// Wrap is a driver's last word on an error leaving operation op: its
// classification (ClassifyWith with the backend's rules), then
// WithContext with the configured provider.
type Wrap func(err error, op string) error

// Run runs the driver operation op the way every backend does: nothing
// is sent once ctx is done, the error leaves through wrap, and a NotFound
// from a step of Create is Permanent (MissingOnCreate). MissingOnCreate
// comes after wrap, so that a backend error fn returns unclassified (a
// 404 the backend's rules make NotFound) is caught too.
func Run[T any](ctx context.Context, op string, wrap Wrap, fn func(context.Context) (T, error)) (T, error) {
	if err := ctx.Err(); err != nil {
		var zero T
		return zero, wrap(err, op)
	}
	v, err := fn(ctx)
	err = wrap(err, op)
	if op == OpCreate {
		err = MissingOnCreate(err)
	}
	return v, err
}

// RunList is Run for List, which every driver refuses without an
// installation ID (it would match any instance that carries none).
func RunList(ctx context.Context, installationID string, wrap Wrap, fn func(ctx context.Context, installationID string) ([]Instance, error)) ([]Instance, error) {
	return Run(ctx, OpList, wrap, func(ctx context.Context) ([]Instance, error) {
		if installationID == "" {
			return nil, Permanentf("empty installation ID")
		}
		return fn(ctx, installationID)
	})
}

// RunErr is Run for an operation that returns only an error (Delete).
func RunErr(ctx context.Context, op string, wrap Wrap, fn func(context.Context) error) error {
	_, err := Run(ctx, op, wrap, func(ctx context.Context) (struct{}, error) { return struct{}{}, fn(ctx) })
	return err
}

// ClassifyWith gives err its class, once, where a driver meets it, with
// what every backend shares: nil stays nil, an error that already carries
// a class keeps it, a cancelled or expired ctx is Transient; anything
// else is what backend (the backend's own rules) makes of it, and
// Transient when it leaves it unclassified.
func ClassifyWith(err error, backend func(error) error) error {
	if err == nil {
		return nil
	}
	var pe *Error
	if errors.As(err, &pe) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Classify(ClassTransient, err)
	}
	return Classify(ClassTransient, backend(err))
}
