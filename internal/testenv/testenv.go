// Package testenv starts what the integration tests share: a real control
// plane (internal/controlplane) with the provider's CRDs installed, and a
// scheme that knows Kubernetes' kinds and the provider's.
package testenv

import (
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/egressproxy/provider-egressproxy/apis"
	"github.com/egressproxy/provider-egressproxy/internal/controlplane"
)

// Start starts a control plane for t (stopped when t ends) with o, plus
// the provider's CRDs from package/crds, and returns it with the scheme.
func Start(t *testing.T, o controlplane.Options) (*controlplane.ControlPlane, *runtime.Scheme) {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	o.CRDDirectories = append([]string{filepath.Join(root, "package", "crds")}, o.CRDDirectories...)
	cp := controlplane.ForTest(t, o)
	return cp, Scheme(t)
}

// Scheme knows Kubernetes' kinds and the provider's.
func Scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := apis.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}
