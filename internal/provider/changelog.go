package provider

import (
	"context"

	changelogsv1alpha1 "github.com/crossplane/crossplane-runtime/v2/apis/changelogs/proto/v1alpha1"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// secretFields are the inline secrets a proxy may carry, as paths of its
// JSON: its cloud-init (keys, passwords) and kubectl's copy of the applied
// object, which holds the same cloud-init. Secret references are not
// secrets and stay.
var secretFields = [][]string{
	{"spec", "forProvider", "cloudInit"},
	{"metadata", "annotations", corev1.LastAppliedConfigAnnotation},
}

// withoutSecrets wraps a change logger so that the resource it snapshots
// has every one of secretFields replaced by telemetry.Redacted: the change
// log leaves the provider for a sidecar's log stream.
func withoutSecrets(l managed.ChangeLogger) managed.ChangeLogger {
	return redactingChangeLogger{inner: l}
}

type redactingChangeLogger struct {
	inner managed.ChangeLogger
}

func (l redactingChangeLogger) Log(ctx context.Context, mg resource.Managed, op changelogsv1alpha1.OperationType, changeErr error, ad managed.AdditionalDetails) error {
	r, err := redacted(mg)
	if err != nil {
		return errors.Wrap(err, "cannot remove the secrets of the managed resource from its change log entry")
	}
	return l.inner.Log(ctx, r, op, changeErr, ad)
}

// redacted returns a copy of mg with its secretFields redacted; mg, the
// reconciler's object, is left as it is.
func redacted(mg resource.Managed) (resource.Managed, error) {
	// ToUnstructured copies: the map shares nothing with mg.
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(mg)
	if err != nil {
		return nil, err
	}
	for _, f := range secretFields {
		if _, ok, _ := unstructured.NestedString(u, f...); ok {
			if err := unstructured.SetNestedField(u, telemetry.Redacted, f...); err != nil {
				return nil, err
			}
		}
	}
	// An object of mg's type to decode into; every field is overwritten.
	out, ok := mg.DeepCopyObject().(resource.Managed)
	if !ok {
		return nil, errors.Errorf("a copy of %T is not a managed resource", mg)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, out); err != nil {
		return nil, err
	}
	return out, nil
}
