package kubernetes

import (
	"context"
	"strings"
	"testing"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
)

// TestCheckNamesUnknownClusterNetworks: a healthy config whose identity
// may not read the cluster's networks says so in its health, with what
// PodProxies are refused for it and the way out, before any proxy is
// refused; a config that names the cluster's networks, or that reads
// them all, says nothing of it.
func TestCheckNamesUnknownClusterNetworks(t *testing.T) {
	// A pointer: the driver compares its clients, and the interceptor's
	// client is a struct that cannot be compared.
	allowing := &ptrClient{fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).
		WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "egress"}}, serviceCIDR("10.96.0.0/12")).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if r, ok := obj.(*authzv1.SelfSubjectAccessReview); ok {
				r.Status.Allowed = true
				return nil
			}
			return cl.Create(ctx, obj, opts...)
		}}).Build()}
	for name, tc := range map[string]struct {
		reader   client.Reader
		networks []string
		want     string
	}{
		"Forbidden":          {reader: forbidding(allowing), want: "the provider may not get the Service default/kubernetes, list endpointslices"},
		"ForbiddenButNamed":  {reader: forbidding(allowing), networks: []string{"10.0.0.0/8"}},
		"EverythingReadable": {reader: allowing},
	} {
		t.Run(name, func(t *testing.T) {
			disc := &netguard.Discovery{Reader: tc.reader}
			d := New(Options{Provider: "ClusterProviderConfig pods", Config: Config{Namespace: "egress", ClusterNetworks: tc.networks},
				Client: allowing, Networks: disc.Cluster()})
			h := d.Check(context.Background())
			if !h.Healthy() {
				t.Fatalf("Check = %+v; want healthy", h)
			}
			got := h.Targets[0].Details[DetailNetworksUnknown]
			switch {
			case tc.want == "" && got != "":
				t.Errorf("detail %s = %q; want none", DetailNetworksUnknown, got)
			case tc.want != "" && (!strings.Contains(got, tc.want) || !strings.Contains(got, "spec.kubernetes.clusterNetworks") || !strings.Contains(got, "refused")):
				t.Errorf("detail %s = %q; want it to name %q, the refusal and spec.kubernetes.clusterNetworks", DetailNetworksUnknown, got, tc.want)
			}
		})
	}
}

type ptrClient struct{ client.WithWatch }
