package pod

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
)

// ClusterRole is the name of the ClusterRole this project ships
// (cluster/rbac/podproxy.yaml) granting what PodProxies on
// InjectedIdentity need in the provider's own cluster: Crossplane v2.4's
// RBAC manager grants a provider only its own kinds, Secrets, ConfigMaps,
// Events and Leases, and a package cannot ask for more.
const ClusterRole = "provider-egressproxy-podproxy"

// required is what the PodProxy driver does in this cluster, where its
// cache lists and watches cluster-wide and a config may name any
// namespace (kubernetes.Permissions).
var required = kubernetes.Permissions("", true)

// access tells whether this provider's identity holds the permissions
// PodProxies on InjectedIdentity need, asking the API server
// (SelfSubjectAccessReview, which every identity may create) at most once
// per recheck interval: a grant made while the provider runs takes effect
// without a restart.
type access struct {
	reviews authorizationv1.SelfSubjectAccessReviewInterface
	recheck time.Duration

	mu      sync.Mutex
	checked time.Time
	err     error
}

// missingError is the error of every PodProxy on InjectedIdentity while
// permissions are missing: it names them and the fix.
type missingError struct{ missing []kubernetes.Permission }

func (e *missingError) Error() string {
	s := make([]string, len(e.missing))
	for i, p := range e.missing {
		s[i] = p.String()
	}
	return fmt.Sprintf("this provider's service account may not %s, which PodProxies on InjectedIdentity need: "+
		"bind ClusterRole %s to it (docs/install.md, PodProxy permissions: a ClusterRoleBinding and a DeploymentRuntimeConfig naming the service account); "+
		"the provider picks the grant up without a restart",
		strings.Join(s, ", "), ClusterRole)
}

// check is nil when every permission is held, else a *missingError. An API
// error is returned as such (and checked again at the next call).
func (a *access) check(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.checked.IsZero() && (a.err == nil || time.Since(a.checked) < a.recheck) {
		return a.err
	}
	var missing []kubernetes.Permission
	for _, p := range required {
		r, err := a.reviews.Create(ctx, &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: p.Attributes(),
		}}, metav1.CreateOptions{})
		if err != nil {
			return errors.Wrapf(err, "cannot review this provider's permissions (%s)", p)
		}
		if !r.Status.Allowed {
			missing = append(missing, p)
		}
	}
	a.checked = time.Now()
	a.err = nil
	if len(missing) > 0 {
		a.err = &missingError{missing: missing}
	}
	return a.err
}
