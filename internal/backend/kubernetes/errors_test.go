package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func TestClassify(t *testing.T) {
	deployments := schema.GroupResource{Group: "apps", Resource: "deployments"}
	quota := kerrors.NewForbidden(deployments, "p", errors.New(`exceeded quota: compute, requested: count/deployments.apps=1, used: count/deployments.apps=5, limited: count/deployments.apps=5`))
	failedQuota := kerrors.NewForbidden(deployments, "p", errors.New(`failed quota: compute: must specify limits.cpu`))
	rbac := kerrors.NewForbidden(deployments, "p", errors.New(`User "system:serviceaccount:crossplane-system:provider" cannot create resource "deployments"`))
	terminating := &kerrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `deployments.apps "p" is forbidden: unable to create new content in namespace egress because it is being terminated`,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "NamespaceTerminating"}}},
	}}
	for name, tc := range map[string]struct {
		err  error
		want proxy.Class
	}{
		"not found":                   {kerrors.NewNotFound(deployments, "p"), proxy.ClassNotFound},
		"quota":                       {quota, proxy.ClassQuota},
		"quota, wrapped":              {fmt.Errorf("cannot create Deployment: %w", quota), proxy.ClassQuota},
		"failed quota (needs limits)": {failedQuota, proxy.ClassPermanent},
		"RBAC":                        {rbac, proxy.ClassPermanent},
		"namespace terminating":       {terminating, proxy.ClassTransient},
		"unauthorized":                {kerrors.NewUnauthorized("bad token"), proxy.ClassPermanent},
		"invalid":                     {kerrors.NewInvalid(schema.GroupKind{Group: "apps", Kind: "Deployment"}, "p", nil), proxy.ClassPermanent},
		"bad request":                 {kerrors.NewBadRequest("nope"), proxy.ClassPermanent},
		"conflict":                    {kerrors.NewConflict(deployments, "p", errors.New("modified")), proxy.ClassTransient},
		"already exists":              {kerrors.NewAlreadyExists(deployments, "p"), proxy.ClassTransient},
		"throttled":                   {kerrors.NewTooManyRequests("slow down", 1), proxy.ClassTransient},
		"server timeout":              {kerrors.NewServerTimeout(deployments, "create", 1), proxy.ClassTransient},
		"internal":                    {kerrors.NewInternalError(errors.New("etcd")), proxy.ClassTransient},
		"unavailable":                 {kerrors.NewServiceUnavailable("down"), proxy.ClassTransient},
		"network":                     {&net.OpError{Op: "dial", Err: errors.New("connection refused")}, proxy.ClassTransient},
		"cancelled":                   {context.Canceled, proxy.ClassTransient},
		"deadline":                    {fmt.Errorf("get: %w", context.DeadlineExceeded), proxy.ClassTransient},
		"already classified":          {proxy.Permanentf("bad name"), proxy.ClassPermanent},
	} {
		t.Run(name, func(t *testing.T) {
			if got := proxy.ClassOf(classify(tc.err)); got != tc.want {
				t.Errorf("classify(%v) = %s; want %s", tc.err, got, tc.want)
			}
		})
	}
	if classify(nil) != nil {
		t.Errorf("classify(nil) is not nil")
	}
	// The API server's Retry-After (in the status details) is kept, for
	// the controller to wait that long.
	if got := proxy.RetryAfterOf(classify(kerrors.NewTooManyRequests("slow down", 7))); got != 7*time.Second {
		t.Errorf("a 429 asking for 7s reads RetryAfter %v", got)
	}
}

func TestErrorsCarryTheConfiguredProvider(t *testing.T) {
	d := New(Options{Provider: "ClusterProviderConfig pods"})
	err := d.wrap(kerrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("exceeded quota: q")), proxy.OpCreate)
	var pe *proxy.Error
	if !errors.As(err, &pe) || pe.Provider != "ClusterProviderConfig pods" || pe.Op != "create" || pe.Class != proxy.ClassQuota {
		t.Errorf("wrapped error %#v; want Quota from ClusterProviderConfig pods in create", err)
	}
}
